"""A beam-search request at the route (``beam_choices``) over a fake router: each beam's step is a
request of its own with vLLM's step sampling and the beam's tokens after the prompt; the answer
is one choice per beam with its text, tokens, finish reason and usage; both doors take
``use_beam_search`` and ``length_penalty`` and refuse what vLLM refuses or epd does not write
yet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.common.errors import InvalidArgument
from epd.server.route import openai_completions as completions
from epd.server.route import openai_schema as schema
from epd.server.route.choices import generate_choices
from epd.server.route.metrics import RouteMetrics
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, ImageSource
from epd.server.route.router import RouteChunk
from epd.v1 import generation_pb2 as g

EOS = 2
# the fake model's log probabilities of the next token, each times 1 + 0.1 per token before it
# after the prompt
NEXT = [(7, -0.5), (EOS, -0.9), (8, -1.2), (9, -2.0), (10, -3.0), (11, -4.0)]


class FakeRouter:
    """Answers each step with ``NEXT`` (cut to the asked number) and records the steps."""

    def __init__(self, prompt: list[int]) -> None:
        tokenizer = SimpleNamespace(decode=self.decode)
        self.prompts = SimpleNamespace(
            eos_token_id=EOS, max_context_tokens=None, tokenizer=tokenizer
        )
        self.prompt = prompt
        self.steps: list[ChatRequest] = []
        self.sources: list[list[ImageSource]] = []
        self.metrics: RouteMetrics | None = None

    @staticmethod
    def decode(token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{t}>" for t in token_ids if t != EOS or not skip_special_tokens)

    async def answer(
        self, request: ChatRequest, sources: list[ImageSource], timeout_s: float | None
    ) -> AsyncIterator[Any]:
        self.steps.append(request)
        self.sources.append(sources)
        found = NEXT[: request.sampling.logprobs]
        scale = 1 + 0.1 * len(request.answer_prefix)
        position = g.TokenLogprobs(
            candidates=[
                g.Logprob(token_id=t, logprob=lp * scale, rank=rank, token=f"'{t}'")
                for rank, (t, lp) in enumerate(found, 1)
            ]
        )
        prompt = [*(request.prompt_token_ids or self.prompt), *request.answer_prefix]
        shown = prompt if request.return_token_ids else None
        text = "<chat>" if request.return_prompt_text else None
        yield RouteChunk(
            "", [found[0][0]], g.FINISH_REASON_LENGTH, None, [position], [], shown, text
        )


def chat(**fields: Any) -> ChatRequest:
    sampling = g.SamplingParams(max_tokens=3, n=2, temperature=0.5, seed=4, cache_salt="s")
    sampling.stop.append("x")
    messages = [ChatMessage("user", [ChatPart(text="hi")])]
    return ChatRequest("r", "tiny", messages, sampling, use_beam_search=True, **fields)


async def answer(router: FakeRouter, request: ChatRequest) -> list[tuple[int, RouteChunk]]:
    return [(c.index, c.chunk) async for c in generate_choices(router, request)]  # type: ignore[arg-type]


async def test_each_step_is_vllms_step_of_one_beam_after_the_prompt() -> None:
    router = FakeRouter([1, 1, 1])
    await answer(router, chat())
    first, *later = router.steps
    assert [step.answer_prefix for step in router.steps] == [[], [7], [8], [7, 7], [8, 7]]
    assert first.return_token_ids and not any(step.return_token_ids for step in later)
    assert len({step.request_id for step in router.steps}) == len(router.steps)
    expected = g.SamplingParams(max_tokens=1, temperature=0.5, logprobs=4, cache_salt="s")
    assert all(step.sampling == expected for step in router.steps)
    assert not any(step.use_beam_search for step in router.steps)


async def test_a_search_reads_its_images_once_for_all_its_steps() -> None:
    router = FakeRouter([1, 1, 1])
    request = chat()
    pictures = [ImageSource(url="http://example.com/a.png"), ImageSource(data=b"b")]
    request.messages[0].parts += [ChatPart(image=picture) for picture in pictures]
    await answer(router, request)
    assert len(router.steps) == 5 and router.sources[0] == pictures
    assert all(sources is router.sources[0] for sources in router.sources)


async def test_the_answer_is_one_choice_per_beam_best_first() -> None:
    router = FakeRouter([1, 1, 1])
    (first, second) = await answer(router, chat(length_penalty=1.0))
    assert first[0] == 0 and second[0] == 1
    # NOTE: [7, 7, 7] scores -1.65 / 6, EOS at once -0.9 / 3, [7, EOS] -1.49 / 4
    assert (first[1].token_ids, first[1].text) == ([7, 7, 7], "<7><7><7>")
    assert first[1].finish_reason == g.FINISH_REASON_LENGTH
    assert first[1].usage == g.Usage(prompt_tokens=3, completion_tokens=3)
    assert (second[1].token_ids, second[1].text) == ([], "")
    assert second[1].finish_reason == g.FINISH_REASON_STOP
    assert first[1].prompt_token_ids is None
    router = FakeRouter([1, 1, 1])
    (_, second) = await answer(router, chat(length_penalty=0.0))
    assert second[1].token_ids == [7] and second[1].finish_reason == g.FINISH_REASON_STOP


async def test_a_kept_eos_is_a_token_not_text_and_the_prompt_is_shown_when_asked() -> None:
    router = FakeRouter([1, 1, 1])
    request = chat(return_token_ids=True)
    request.sampling.include_stop_str_in_output = True
    (_, stopped) = [chunk for _, chunk in await answer(router, request)]
    assert (stopped.token_ids, stopped.text) == ([EOS], "")
    assert stopped.usage == g.Usage(prompt_tokens=3, completion_tokens=1)
    assert stopped.prompt_token_ids == [1, 1, 1]


async def test_the_chat_template_s_text_is_on_each_beam_when_asked() -> None:
    router = FakeRouter([1, 1, 1])
    chunks = [chunk for _, chunk in await answer(router, chat(return_prompt_text=True))]
    assert [chunk.prompt_text for chunk in chunks] == ["<chat>", "<chat>"]
    assert [step.return_prompt_text for step in router.steps] == [True] + [False] * 4
    (_, plain) = [chunk for _, chunk in await answer(router, chat())]
    assert plain.prompt_text is None


async def test_each_prompt_has_its_own_beams_numbered_after_the_prompts_before() -> None:
    router = FakeRouter([])
    request = chat(prompt_token_ids=[4, 4], more_prompts=[[5, 5, 5, 5]])
    indices = [(index, chunk.usage.prompt_tokens) for index, chunk in await answer(router, request)]
    assert indices == [(0, 2), (1, 2), (2, 4), (3, 4)]
    assert len({step.request_id for step in router.steps}) == len(router.steps)
    assert not any(step.more_prompts for step in router.steps)


async def test_the_route_s_metrics_count_each_prompt_s_search_once_not_its_steps() -> None:
    router = FakeRouter([])
    router.metrics = RouteMetrics(registry := CollectorRegistry())
    await answer(router, chat(prompt_token_ids=[4, 4], more_prompts=[[5, 5, 5, 5]]))
    text = generate_latest(registry).decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert len(router.steps) == 10
    assert found["epd_route_requests_total"] == 2
    assert found["epd_route_generated_tokens_total"] == 2 * (3 + 0)  # NOTE: [7, 7, 7], ended []
    assert found["epd_route_requests_in_flight"] == 0


BODY = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
BEAMS = {**BODY, "use_beam_search": True, "n": 3, "length_penalty": 0.5, "temperature": 0}


def test_the_chat_door_takes_beam_search() -> None:
    """n beams at temperature 0 (vLLM's to_beam_search_params; its sampling's greedy n > 1 is
    refused), the engines' steps checked as they will run."""
    request = schema.to_chat_request({**BEAMS, "stop": ["x"], "seed": 3}, "tiny")
    assert (request.use_beam_search, request.length_penalty, request.sampling.n) == (True, 0.5, 3)
    assert request.sampling == g.SamplingParams(max_tokens=3, n=3)
    plain = schema.to_chat_request({**BODY, "length_penalty": 2.0}, "tiny")
    assert not plain.use_beam_search


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_completions_door_takes_beam_search_but_not_streamed(tokenizer: Any) -> None:
    body = {"model": "tiny", "prompt": "The sea is", "use_beam_search": True, "n": 2}
    request, _ = completions.to_completion_request(body, "tiny", tokenizer)
    assert (request.use_beam_search, request.length_penalty) == (True, 1.0)
    with pytest.raises(InvalidArgument) as caught:
        completions.to_completion_request({**body, "stream": True}, "tiny", tokenizer)
    assert (caught.value.message, caught.value.metadata["param"]) == (
        completions.STREAMED_BEAMS,
        "stream",
    )


@pytest.mark.parametrize("logprobs", [0, 2])
def test_both_doors_take_logprobs_with_beam_search(tokenizer: Any, logprobs: int) -> None:
    body = {"model": "tiny", "prompt": "The sea is", "use_beam_search": True, "logprobs": logprobs}
    request, _ = completions.to_completion_request(body, "tiny", tokenizer)
    assert request.sampling.HasField("logprobs") and request.sampling.logprobs == logprobs
    chat_request = schema.to_chat_request({**BEAMS, "logprobs": True, "top_logprobs": 2}, "tiny")
    assert chat_request.sampling.logprobs == 2
    assert not schema.to_chat_request(BEAMS, "tiny").sampling.HasField("logprobs")


async def test_each_beam_token_has_its_step_s_candidates_without_their_texts() -> None:
    """As vLLM's beam search: each token's step lists the candidates in the engine's order
    (the token where it ranks), without texts (vLLM's steps are not detokenized); an ended
    beam's end-of-sequence step is not shown where its token is not kept."""
    router = FakeRouter([1, 1, 1])
    request = chat()
    request.sampling.logprobs = 1
    (first, second) = [chunk for _, chunk in await answer(router, request)]
    assert len(first.logprobs) == 3 and second.logprobs == []
    step = first.logprobs[1]
    assert [(c.token_id, c.rank) for c in step.candidates] == [(7, 1), (EOS, 2), (8, 3), (9, 4)]
    assert not any(c.HasField("token") for c in step.candidates)
    assert step.candidates[0].logprob == pytest.approx(-0.5 * 1.1)
    (_, plain) = [chunk for _, chunk in await answer(router, chat())]
    assert all(not chunk.logprobs for chunk in (plain,))
