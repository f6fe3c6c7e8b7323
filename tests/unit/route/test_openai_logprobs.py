"""Log probabilities as vLLM's OpenAI server writes them: tokens named by their text or as
``token_id:N`` (return_tokens_as_token_ids), a chat answer's prompt_logprobs, and the
candidates vLLM's logprob_token_ids name."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_answers, openai_logprobs
from epd.server.route import openai_completions as completions
from epd.server.route import openai_schema as schema
from epd.server.route.openai_completions import completion_logprobs_json
from epd.server.route.openai_logprobs import prompt_logprobs_json, token_namer
from epd.server.route.router import RouteChunk
from epd.v1 import generation_pb2 as g

POSITION = g.TokenLogprobs(
    candidates=[
        g.Logprob(token_id=7, logprob=-1.0, rank=2, token="é"),
        g.Logprob(token_id=3, logprob=float("-inf"), rank=1),
    ]
)


def test_tokens_are_named_by_their_text_their_id_or_as_ids() -> None:
    chat = openai_logprobs.logprobs_json([POSITION], 2, lambda token_id: f"<{token_id}>")[
        "content"
    ][0]
    assert (chat["token"], [t["token"] for t in chat["top_logprobs"]]) == ("é", ["é", "<3>"])
    assert chat["top_logprobs"][1]["logprob"] == -9999.0, "vLLM's floor for -inf"
    as_ids = openai_logprobs.logprobs_json([POSITION], 2, str, as_token_ids=True)
    entry = as_ids["content"][0]
    assert [t["token"] for t in entry["top_logprobs"]] == ["token_id:7", "token_id:3"]
    assert entry["token"] == "token_id:7" and entry["bytes"] == list("é".encode())
    assert entry["top_logprobs"][0]["bytes"] == list(b"token_id:7")


def test_a_chat_answer_carries_its_prompts_logprobs_as_vllm_writes_them() -> None:
    answer = openai_answers.Answer()
    assert openai_answers.completion("r", "m", [answer])["prompt_logprobs"] is None
    answer.add(RouteChunk("x", [1], prompt_logprobs=[g.TokenLogprobs(), POSITION]))
    answer.add(RouteChunk("y", [2]))
    assert openai_answers.completion("r", "m", [answer])["prompt_logprobs"] == [
        None,
        {
            "7": {"logprob": -1.0, "rank": 2, "decoded_token": "é"},
            "3": {"logprob": -9999.0, "rank": 1, "decoded_token": None},
        },
    ]
    assert prompt_logprobs_json([]) is None
    assert token_namer(str, as_token_ids=True)(5, "x") == "token_id:5"


def test_echo_repeats_the_last_message_when_its_role_is_the_answers() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "It is"}]
    body = {"model": "tiny", "messages": messages, "echo": True}
    continued = schema.to_chat_request({**body, "add_generation_prompt": False}, "tiny")
    assert continued.echo == "It is"
    assert continued.sampling.prompt_logprobs == 0, "vLLM's echo asks for the prompt's logprobs"
    assert schema.to_chat_request(body, "tiny").echo == "It is", "the answer's role: assistant"
    asked = schema.to_chat_request({**body, "messages": messages[:1]}, "tiny")
    assert asked.echo == "", "the last message is the user's, not the answer's role"
    assert not schema.to_chat_request(body | {"echo": False}, "tiny").echo
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    user = [{"role": "user", "content": parts}]
    last = {**body, "messages": user, "add_generation_prompt": False}
    assert schema.to_chat_request(last, "tiny").echo == "a\nb"


def test_the_output_options_reach_the_sampling_and_the_request() -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt_logprobs": 2,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "return_tokens_as_token_ids": True,
        "priority": -1,
        "cache_salt": "tenant-a",
    }
    request = schema.to_chat_request(body, "tiny")
    sampling = request.sampling
    assert sampling.prompt_logprobs == 2 and request.tokens_as_ids
    assert (sampling.skip_special_tokens, sampling.spaces_between_special_tokens) == (False, False)
    assert (sampling.priority, sampling.cache_salt) == (-1, "tenant-a")
    plain = schema.to_chat_request({**body, "prompt_logprobs": None}, "tiny").sampling
    assert not plain.HasField("prompt_logprobs")
    defaults = {"model": "tiny", "messages": body["messages"]}
    unset = schema.to_chat_request(defaults, "tiny")
    assert not unset.sampling.HasField("skip_special_tokens"), "the ordinary message as it was"
    assert not unset.tokens_as_ids


def test_logprob_token_ids_reach_the_sampling_and_every_one_is_shown() -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "tiny", "messages": messages, "logprobs": True, "top_logprobs": 1}
    sampling = schema.to_chat_request({**body, "logprob_token_ids": [9, 5]}, "tiny").sampling
    assert list(sampling.logprob_token_ids) == [9, 5]
    assert not sampling.HasField("logprobs"), "vLLM: the ids take the place of top_logprobs"
    assert openai_logprobs.num_top_logprobs(sampling) == openai_logprobs.ALL_CANDIDATES
    assert openai_logprobs.num_top_logprobs(schema.to_chat_request(body, "tiny").sampling) == 1
    position = g.TokenLogprobs(
        candidates=[g.Logprob(token_id=t, logprob=-t, token=str(t)) for t in (7, 9, 5)]
    )
    chat = openai_logprobs.logprobs_json([position], openai_logprobs.ALL_CANDIDATES, str)
    assert [t["token"] for t in chat["content"][0]["top_logprobs"]] == ["7", "9", "5"]
    name = token_namer(str)
    shown = completion_logprobs_json([position], openai_logprobs.ALL_CANDIDATES, name)
    assert shown["top_logprobs"] == [{"7": -7.0, "9": -9.0, "5": -5.0}]
    assert completion_logprobs_json([position], 0, name)["top_logprobs"] == [{"7": -7.0}]


def test_logprob_token_ids_without_logprobs_are_refused_as_vllm_refuses_them() -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request({**body, "logprob_token_ids": [5]}, "tiny")
    assert caught.value.metadata["param"] == "logprob_token_ids"
    with pytest.raises(InvalidArgument) as caught:
        completions.to_completion_request(
            {"model": "tiny", "prompt": [1, 2], "logprob_token_ids": [5]}, "tiny", None
        )
    assert caught.value.metadata["param"] == "logprob_token_ids"


# A beam search's step, as vLLM's beam search keeps it: the candidates in the engine's order,
# without texts (its steps are not detokenized).
STEP = g.TokenLogprobs(
    candidates=[
        g.Logprob(token_id=4, logprob=-0.5, rank=1),
        g.Logprob(token_id=9, logprob=-1.5, rank=2),
        g.Logprob(token_id=6, logprob=-2.0, rank=3),
    ]
)


def test_a_beam_token_is_shown_beside_its_step_s_first_candidates() -> None:
    """vLLM shows a beam's token (found among its step's candidates) with the step's first
    top_logprobs (or logprobs + 1) candidates, each named by a decode of its id, and no bytes of
    a decoded text it has none of."""
    decode = lambda token_id: f"<{token_id}>"  # noqa: E731
    [entry] = openai_logprobs.logprobs_json([STEP], 2, decode, token_ids=[9])["content"]
    assert (entry["token"], entry["logprob"], entry["bytes"]) == ("<9>", -1.5, None)
    assert [t["token"] for t in entry["top_logprobs"]] == ["<4>", "<9>"]
    [first] = openai_logprobs.logprobs_json([STEP], 1, decode)["content"]
    assert first["token"] == "<4>"
    body = completion_logprobs_json([STEP, STEP], 1, token_namer(decode), 0, [6, 4])
    assert (body["tokens"], body["token_logprobs"]) == (["<6>", "<4>"], [-2.0, -0.5])
    assert body["top_logprobs"] == [{"<4>": -0.5, "<9>": -1.5}] * 2
    assert body["text_offset"] == [0, 3]
