"""OpenAI chat-completions bodies -> ChatRequest: the sampling parameters a body sets, and the
values refused naming their parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epd.server.route import openai_schema as schema
from tests.unit.route.chat_bodies import BODY, refusal

# An xgrammar structural tag, the constraint vLLM's tool parsers build for tool calls.
TAG = json.dumps(
    {
        "type": "structural_tag",
        "format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"},
    }
)


def test_vllm_extensions_reach_the_sampling_parameters() -> None:
    body = {**BODY, "ignore_eos": True, "top_k": 5, "stop_token_ids": [7], "seed": 3}
    sampling = schema.to_chat_request({**body, "stop": "END"}, "tiny").sampling
    assert (sampling.ignore_eos, sampling.top_k, list(sampling.stop_token_ids)) == (True, 5, [7])
    assert (sampling.seed, list(sampling.stop), sampling.max_tokens) == (3, ["END"], 3)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("max_tokens", -1),
        ("max_completion_tokens", 1.5),
        ("temperature", "hot"),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", 2.5),
        ("temperature", 10**400),
        ("top_p", 0),
        ("top_p", 1.01),
        ("seed", 2**70),
        ("seed", 2**64),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", 5),
        ("stop_token_ids", 7),
        ("stream_options", []),
        ("stream_options", {"include_usage": "yes"}),
        ("top_logprobs", 3),
        ("user", 7),
        ("model", 5),
    ],
)
def test_what_vllm_refuses_is_refused_naming_its_parameter(param: str, value: Any) -> None:
    error = refusal({**BODY, param: value})
    assert error.reason == "BAD_REQUEST" and error.metadata["param"].startswith(param)


@pytest.mark.parametrize(
    ("param", "value"),
    [("stop", "\ud800"), ("model", "tiny\udfff"), ("stop_token_ids", [-1]), ("top_k", 2**31)],
)
def test_what_no_hop_can_carry_is_refused_though_vllm_takes_it(param: str, value: Any) -> None:
    """Lone surrogates and negative token ids: protobuf cannot hold them; a top_k beyond int32:
    vLLM's engine keeps it in an int32 tensor (docs/route.md)."""
    assert refusal({**BODY, param: value}).metadata["param"].startswith(param)


@pytest.mark.parametrize(
    ("param", "value", "field", "expected"),
    [
        ("max_tokens", "2", "max_tokens", 2),
        ("top_k", -1, "top_k", 0),
        ("ignore_eos", 1, "ignore_eos", True),
        ("presence_penalty", 0.5, "presence_penalty", 0.5),
        ("frequency_penalty", -1, "frequency_penalty", -1.0),
        ("repetition_penalty", 1.25, "repetition_penalty", 1.25),
        ("min_p", 0.25, "min_p", 0.25),
        ("min_tokens", 2, "min_tokens", 2),
        ("include_stop_str_in_output", True, "include_stop_str_in_output", True),
    ],
)
def test_what_vllm_takes_reaches_the_sampling_parameters(
    param: str, value: Any, field: str, expected: Any
) -> None:
    sampling = schema.to_chat_request({**BODY, param: value}, "tiny").sampling
    assert getattr(sampling, field) == expected


def test_logprobs_reach_the_sampling_parameters_as_vllm_sets_them() -> None:
    sampling = schema.to_chat_request(
        {**BODY, "logprobs": True, "top_logprobs": 4}, "tiny"
    ).sampling
    assert sampling.HasField("logprobs") and sampling.logprobs == 4
    sampling = schema.to_chat_request({**BODY, "logprobs": True}, "tiny").sampling
    assert sampling.HasField("logprobs") and sampling.logprobs == 0
    assert not schema.to_chat_request({**BODY, "top_logprobs": 0}, "tiny").sampling.HasField(
        "logprobs"
    )


def test_n_reaches_the_sampling_parameters_up_to_its_limit() -> None:
    assert schema.to_chat_request({**BODY, "n": 3}, "tiny").sampling.n == 3
    assert refusal({**BODY, "n": 129}).metadata["param"] == "n"
    assert "n must be at least 1" in refusal({**BODY, "n": 0}).message


def test_token_lists_and_biases_reach_the_sampling_parameters() -> None:
    body = {
        **BODY,
        "logit_bias": {"7": -100, "9": 2.5},
        "bad_words": ["no"],
        "allowed_token_ids": [3, 4],
    }
    sampling = schema.to_chat_request(body, "tiny").sampling
    assert dict(sampling.logit_bias) == {7: -100.0, 9: 2.5}
    assert (list(sampling.bad_words), list(sampling.allowed_token_ids)) == (["no"], [3, 4])


@pytest.mark.parametrize(
    ("fields", "constraint", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", True),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {}},
                }
            },
            "json_schema",
            "{}",
        ),
        ({"structured_outputs": {"regex": "[ab]+"}}, "regex", "[ab]+"),
        ({"structured_outputs": {"grammar": 'root ::= "x"'}}, "grammar", 'root ::= "x"'),
        ({"structured_outputs": {"structural_tag": TAG}}, "structural_tag", TAG),
    ],
)
def test_structured_outputs_reach_the_sampling_parameters(
    fields: dict[str, Any], constraint: str, value: Any
) -> None:
    output = schema.to_chat_request({**BODY, **fields}, "tiny").sampling.structured_output
    assert output.WhichOneof("constraint") == constraint
    assert getattr(output, constraint) == value


def test_a_choice_reaches_the_sampling_parameters_and_text_constrains_nothing() -> None:
    body = {**BODY, "structured_outputs": {"choice": ["yes", "no"]}}
    output = schema.to_chat_request(body, "tiny").sampling.structured_output
    assert list(output.choice.values) == ["yes", "no"]
    body = {**BODY, "response_format": {"type": "text"}}
    assert not schema.to_chat_request(body, "tiny").sampling.HasField("structured_output")


def test_a_stop_token_id_beyond_uint32_is_refused() -> None:
    error = refusal({**BODY, "stop_token_ids": [7, 2**40]})
    assert error.metadata["param"] == "stop_token_ids"


def test_min_tokens_beyond_max_tokens_is_refused_as_vllm_refuses_it() -> None:
    assert "min_tokens" in refusal({**BODY, "min_tokens": 4}).message
