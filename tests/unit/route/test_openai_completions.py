"""/v1/completions bodies -> requests (vLLM's CompletionRequest, one prompt or a list, echo) and
the answers as vLLM writes them (choice numbering, echoed prompts and their logprobs, prompt
logprobs, logprobs with offsets and num_top + 1 candidates, tokens as ids, usage)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_completions as completions
from epd.server.route.choices import child_requests
from epd.server.route.openai_answers import Answer
from epd.server.route.openai_logprobs import token_namer
from epd.server.route.router import RouteChunk
from epd.v1 import generation_pb2 as g

BODY = {"model": "tiny", "prompt": "The sea is", "max_tokens": 4}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_text_prompt_is_tokenised_without_a_template_and_echoed_when_asked(
    tokenizer: Any,
) -> None:
    request, prompt = completions.to_completion_request(BODY, "tiny", tokenizer)
    assert request.prompt_token_ids == tokenizer("The sea is")["input_ids"]
    assert request.messages == [] and prompt.echo is None
    _, echoed = completions.to_completion_request({**BODY, "echo": True}, "tiny", tokenizer)
    assert echoed.echo == ["The sea is"]
    request, _ = completions.to_completion_request({**BODY, "max_tokens": None}, "tiny", tokenizer)
    assert request.sampling.max_tokens == 16


def test_what_vllms_generation_endpoints_ignore_is_taken(tokenizer: Any) -> None:
    ignored = {
        "return_token_offsets": True,
        "mm_payload": "none",
        "routed_experts_prompt_start": 2,
        "watermarking": True,
        "session_id": "conversation-7",
    }
    request, _ = completions.to_completion_request({**BODY, **ignored}, "tiny", tokenizer)
    assert request.sampling.max_tokens == BODY["max_tokens"]


def test_token_ids_go_as_they_are(tokenizer: Any) -> None:
    body = {**BODY, "prompt": [5, 6, 7], "echo": True}
    request, prompt = completions.to_completion_request(body, "tiny", tokenizer)
    assert request.prompt_token_ids == [5, 6, 7]
    assert prompt.echo == [tokenizer.decode([5, 6, 7])]


@pytest.mark.parametrize(
    ("fields", "param", "reason"),
    [
        ({"prompt": [5, 10**6]}, "prompt", "BAD_REQUEST"),
        ({"prompt": [[5], [10**6]]}, "prompt", "BAD_REQUEST"),
        ({"prompt": []}, "prompt", "BAD_REQUEST"),
        ({"prompt": [[5]] * 65, "n": 2}, "prompt", "LIMIT_EXCEEDED"),
        ({"suffix": "!"}, "suffix", "UNSUPPORTED_PARAMETER"),
        ({"max_tokens": -1}, "max_tokens", "BAD_REQUEST"),
    ],
)
def test_what_epd_or_vllm_refuses_is_refused_by_name(
    tokenizer: Any, fields: dict[str, Any], param: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        completions.to_completion_request({**BODY, **fields}, "tiny", tokenizer)
    assert (caught.value.reason, caught.value.metadata["param"]) == (reason, param)


def test_completion_logprobs_are_vllms_with_offsets_and_one_more_candidate() -> None:
    positions = [
        g.TokenLogprobs(
            candidates=[
                g.Logprob(token_id=1, logprob=-0.5, rank=2, token="ab"),
                g.Logprob(token_id=2, logprob=-0.1, rank=1, token="c"),
                g.Logprob(token_id=3, logprob=-2.0, rank=3, token="d"),
            ]
        ),
        g.TokenLogprobs(candidates=[g.Logprob(token_id=4, logprob=-0.2, rank=1)]),
    ]
    name = token_namer(lambda t: f"<{t}>")
    body = completions.completion_logprobs_json(positions, 1, name, 10)
    assert body["tokens"] == ["ab", "<4>"]
    assert body["text_offset"] == [10, 12]
    assert body["token_logprobs"] == [-0.5, pytest.approx(-0.2)]
    assert body["top_logprobs"][0] == {"ab": -0.5, "c": pytest.approx(-0.1)}


def test_a_list_of_prompts_gets_n_choices_each_numbered_as_vllm_numbers_them(
    tokenizer: Any,
) -> None:
    body = {**BODY, "prompt": [[4], [5, 6]], "n": 2, "seed": 4, "temperature": 1.0}
    request, prompt = completions.to_completion_request(body, "tiny", tokenizer)
    assert request.more_prompts == [[5, 6]] and prompt.token_ids == [[4], [5, 6]]
    children = child_requests(request)
    assert [c.request_id[-2:] for c in children] == ["-0", "-1", "-2", "-3"]
    assert [c.prompt_token_ids for c in children] == [[4], [4], [5, 6], [5, 6]]
    assert [c.sampling.seed for c in children] == [4, 5, 4, 5], "seed + i within each prompt"
    assert all(c.sampling.n == 1 and not c.more_prompts for c in children)


def chunk(text: str, *, prompt: int = 0, done: bool = False, positions: Any = ()) -> RouteChunk:
    """A RouteChunk of ``text`` (one token, logprob -0.5); ``done``: the last, with usage."""
    usage = g.Usage(prompt_tokens=prompt, completion_tokens=1) if done else None
    return RouteChunk(
        text,
        [9],
        g.FINISH_REASON_LENGTH if done else 0,
        usage,
        [g.TokenLogprobs(candidates=[g.Logprob(token_id=9, logprob=-0.5, rank=1, token=text)])],
        list(positions),
    )


PROMPT_POSITIONS = [
    g.TokenLogprobs(),
    g.TokenLogprobs(
        candidates=[
            g.Logprob(token_id=6, logprob=-3.0, rank=4, token=" sea"),
            g.Logprob(token_id=2, logprob=-0.25, rank=1, token=" is"),
        ]
    ),
]


def writer(tokenizer: Any, **fields: Any) -> completions.CompletionWriter:
    body = {**BODY, "prompt": [5, 6], **fields}
    request, prompt = completions.to_completion_request(body, "tiny", tokenizer)
    return completions.CompletionWriter(request, prompt, lambda t: f"<{t}>")


def test_echo_with_logprobs_shows_the_prompts_tokens_and_logprobs_first(tokenizer: Any) -> None:
    echo = writer(tokenizer, echo=True, logprobs=1)
    answer = Answer()
    answer.add(chunk(" x", positions=PROMPT_POSITIONS, prompt=2, done=True))
    (choice,) = echo.whole([answer])["choices"]
    assert choice["text"] == tokenizer.decode([5, 6]) + " x"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["<5>", " sea", " x"], "the first prompt token by its id"
    assert logprobs["token_logprobs"] == [None, -3.0, -0.5]
    assert logprobs["top_logprobs"] == [None, {" sea": -3.0, " is": -0.25}, {" x": -0.5}]
    assert logprobs["text_offset"] == [0, 3, 7]
    assert choice["prompt_logprobs"] == [
        None,
        {
            "6": {"logprob": -3.0, "rank": 4, "decoded_token": " sea"},
            "2": {"logprob": -0.25, "rank": 1, "decoded_token": " is"},
        },
    ]
    streamed = echo.delta(0, chunk(" x", positions=PROMPT_POSITIONS), Answer())
    assert streamed["choices"][0]["logprobs"]["tokens"] == ["<5>", " sea", " x"]


def test_echo_without_generation_answers_the_prompt_alone(tokenizer: Any) -> None:
    echo = writer(tokenizer, echo=True, logprobs=0, max_tokens=0)
    assert echo.request.sampling.max_tokens == 1, "vLLM samples one token all the same"
    answer = Answer()
    answer.add(chunk(" x", positions=PROMPT_POSITIONS, prompt=2, done=True))
    body = echo.whole([answer])
    (choice,) = body["choices"]
    assert choice["text"] == tokenizer.decode([5, 6]) and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["<5>", " sea"]
    assert body["usage"]["completion_tokens"] == 1


def test_tokens_as_ids_and_every_prompt_counted_once(tokenizer: Any) -> None:
    as_ids = writer(tokenizer, prompt=[[5, 6], [7]], n=2, logprobs=0)
    as_ids.request.tokens_as_ids = True
    answers = [Answer() for _ in range(4)]
    for index, answer in enumerate(answers):
        answer.add(chunk("y", prompt=2 if index < 2 else 1, done=True))
    body = as_ids.whole(answers)
    assert [c["logprobs"]["tokens"] for c in body["choices"]] == [["token_id:9"]] * 4
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    for index in range(4):
        as_ids.delta(index, chunk("y", prompt=2 if index < 2 else 1, done=True), Answer())
    assert (
        as_ids.usage(g.Usage(prompt_tokens=2, completion_tokens=4))["usage"]["prompt_tokens"] == 3
    )


def test_return_token_ids_as_vllm_mixes_them_with_echo(tokenizer: Any) -> None:
    plain = writer(tokenizer, return_token_ids=True)
    answer = Answer()
    answer.add(chunk(" x", prompt=2, done=True))
    (choice,) = plain.whole([answer])["choices"]
    assert (choice["prompt_token_ids"], choice["token_ids"], choice["text"]) == ([5, 6], [9], " x")
    assert "token_ids" not in writer(tokenizer).whole([answer])["choices"][0]
    echo = writer(tokenizer, echo=True, logprobs=1, return_token_ids=True)
    answer = Answer()
    answer.add(chunk(" x", positions=PROMPT_POSITIONS, prompt=2, done=True))
    (choice,) = echo.whole([answer])["choices"]
    assert choice["text"] == " x", "vLLM: with return_token_ids, echo repeats no text"
    assert choice["logprobs"]["tokens"] == ["<5>", " sea", " x"], "but the prompt's logprobs"
    first = echo.delta(0, chunk(" x", positions=PROMPT_POSITIONS), Answer())["choices"][0]
    assert (first["text"], first["prompt_token_ids"], first["token_ids"]) == (" x", [5, 6], [9])
    so_far = Answer()
    so_far.add(chunk(" x"))
    later = echo.delta(0, chunk(" y", done=True), so_far)["choices"][0]
    assert "prompt_token_ids" not in later and later["token_ids"] == [9]


def test_a_streamed_choice_offsets_its_logprobs_by_the_tokens_shown(tokenizer: Any) -> None:
    stream = writer(tokenizer, logprobs=0)
    held = chunk("", positions=())
    held.logprobs[0].candidates[0].token = "ab"
    first = stream.delta(0, held, Answer())["choices"][0]
    assert first["text"] == "" and first["logprobs"]["text_offset"] == [0]
    so_far = Answer()
    so_far.add(held)
    later = stream.delta(0, chunk("abc"), so_far)["choices"][0]
    assert later["logprobs"]["text_offset"] == [2], "vLLM: after 'ab', though no text was sent"


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        ({"truncate_prompt_tokens": 2}, [7, 8]),
        ({"truncate_prompt_tokens": 2, "truncation_side": "right"}, [5, 6]),
        ({"truncate_prompt_tokens": 9}, [5, 6, 7, 8]),
        ({"truncate_prompt_tokens": 0}, []),
    ],
)
def test_truncate_prompt_tokens_cuts_each_prompt_as_vllm_does(
    tokenizer: Any, fields: dict[str, Any], kept: list[int]
) -> None:
    body = {**BODY, "prompt": [5, 6, 7, 8], "echo": True, **fields}
    if not kept:
        with pytest.raises(InvalidArgument):
            completions.to_completion_request(body, "tiny", tokenizer)
        return
    request, prompt = completions.to_completion_request(body, "tiny", tokenizer)
    assert request.prompt_token_ids == kept and request.truncate_prompt_tokens is None
    assert prompt.echo == [tokenizer.decode([5, 6, 7, 8])], "vLLM echoes the whole prompt"


def test_truncate_prompt_tokens_against_the_context(tokenizer: Any) -> None:
    from epd.server.route.request_check import RequestLimits

    limits = RequestLimits(max_context_tokens=3)
    body = {**BODY, "prompt": [5, 6, 7, 8], "max_tokens": 1}
    request, _ = completions.to_completion_request(
        {**body, "truncate_prompt_tokens": -1}, "tiny", tokenizer, limits=limits
    )
    assert request.prompt_token_ids == [7, 8], "-1: the context less the answer's token"
    with pytest.raises(InvalidArgument) as caught:
        completions.to_completion_request(
            {**body, "truncate_prompt_tokens": 4}, "tiny", tokenizer, limits=limits
        )
    assert caught.value.metadata["param"] == "truncate_prompt_tokens"
