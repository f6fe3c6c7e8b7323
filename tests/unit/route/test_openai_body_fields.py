"""OpenAI chat-completions bodies -> ChatRequest: the fields taken and doing nothing here (a
proxy's transfer params, defaults, vLLM's ignored and unknown fields), and random bodies."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epd.common.errors import InvalidArgument
from epd.server.route import openai_answers
from epd.server.route import openai_schema as schema
from tests.unit.route.chat_bodies import BODY, refusal


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("kv_transfer_params", {"do_remote_decode": True}),
        ("ec_transfer_params", {"do_remote_encode": True}),
    ],
)
def test_a_proxys_transfer_params_are_taken_and_reach_no_engine(param: str, value: Any) -> None:
    """As ``vllm serve`` without a connector, which disables them: the route makes every
    hand-off itself, so they go nowhere; a ``vllm_xargs`` key of that name is still refused."""
    sampling = schema.to_chat_request({**BODY, param: value}, "tiny").sampling
    assert sampling.vllm_xargs == ""
    with_xargs = {**BODY, param: value, "vllm_xargs": {"tag": "a"}}
    assert schema.to_chat_request(with_xargs, "tiny").sampling.vllm_xargs == '{"tag": "a"}'
    error = refusal({**BODY, "vllm_xargs": {param: "x"}})
    assert error.metadata["param"] == "vllm_xargs"


def test_unimplemented_fields_at_their_defaults_and_harmless_ones_pass() -> None:
    no_ops = {
        "n": 1,
        "logprobs": False,
        "top_logprobs": 0,
        "echo": False,
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "logit_bias": {},
        "user": "u1",
        "parallel_tool_calls": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "skip_special_tokens": True,
        "request_id": "r1",
    }
    assert schema.to_chat_request({**BODY, **no_ops}, "tiny").sampling.max_tokens == 3


# vLLM's fields that its generation endpoints take and do nothing with here, at values not
# their defaults
IGNORED = {
    "return_token_offsets": True,
    "mm_payload": "none",
    "return_mm_kwargs": False,
    "routed_experts_prompt_start": 2,
    "watermarking": True,
    "session_id": "conversation-7",
    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    "ec_transfer_params": {"do_remote_encode": True},
}


def test_what_vllms_generation_endpoints_ignore_is_taken() -> None:
    assert set(IGNORED) == schema.IGNORED_FIELDS
    assert schema.to_chat_request({**BODY, **IGNORED}, "tiny").sampling.max_tokens == 3
    assert refusal({**BODY, **IGNORED, "routed_experts_prompt_start": -1}).metadata["param"] == (
        "routed_experts_prompt_start"
    )


def test_an_unknown_field_is_accepted_as_vllm_accepts_it() -> None:
    """vLLM accepts fields it does not know (and logs them); so do OpenAI's newer ones."""
    extra = {"temprature": 0.5, "metadata": {"k": "v"}, "modalities": ["text"], "store": False}
    assert schema.to_chat_request({**BODY, **extra}, "tiny").sampling.max_tokens == 3


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


KEYS = [
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "tools",
    "stream_options",
]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6), st.sampled_from(KEYS))
def test_any_body_is_refused_or_becomes_a_request_that_serializes(body: Any, key: str) -> None:
    """Random values under known keys, over a valid body: InvalidArgument or a sendable request
    (its sampling serializes for the engines, its strings encode as UTF-8 for every hop)."""
    try:
        request = schema.to_chat_request({**BODY, **body}, "tiny")
    except InvalidArgument as e:
        assert openai_answers.error_body(e)[0] == 400
        return
    assert request.sampling.SerializeToString() is not None
    texts = [part.text or "" for message in request.messages for part in message.parts]
    assert "".join([request.model, request.request_id, *texts]).encode()
