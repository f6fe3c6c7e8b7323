"""OpenAI chat-completions bodies -> ChatRequest: the sampling parameters a body leaves out
(vLLM's defaults, the model's generation config, the rest of the context)."""

from __future__ import annotations

import pytest

from epd.server.route import openai_schema as schema
from tests.unit.route.chat_bodies import BODY


def test_nulls_are_absent_and_defaults_are_vllms_up_to_the_context() -> None:
    nulls = {"temperature": None, "top_p": None, "seed": None, "stop": None, "max_tokens": None}
    body = {**BODY, **nulls}
    sampling = schema.to_chat_request(body, "tiny").sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (16, 1.0, 1.0)
    assert not sampling.HasField("seed") and not sampling.stop
    limits = schema.RequestLimits(max_context_tokens=4096)
    assert schema.to_chat_request(body, "tiny", limits=limits).sampling.max_tokens == 4096
    body = {**BODY, "max_completion_tokens": 9, "top_k": -1, "temperature": 2, "top_p": 0.5}
    sampling = schema.to_chat_request(body, "tiny", limits=limits).sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.temperature, sampling.top_p) == (
        9,
        0,
        2.0,
        0.5,
    )


def test_the_models_generation_config_sets_the_defaults_a_body_leaves_out() -> None:
    defaults = {"temperature": 0.7, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 5}
    sampling = schema.to_chat_request(
        {**BODY, "max_tokens": None}, "tiny", defaults=defaults
    ).sampling
    assert (sampling.temperature, sampling.top_k) == (pytest.approx(0.7), 20)
    assert sampling.repetition_penalty == pytest.approx(1.05)
    body = {**BODY, "temperature": 0.5, "top_k": 3}
    sampling = schema.to_chat_request(body, "tiny", defaults=defaults).sampling
    assert (sampling.temperature, sampling.top_k) == (0.5, 3)


def test_max_tokens_beyond_the_models_context_is_the_rest_of_the_context_as_in_vllm() -> None:
    limits = schema.RequestLimits(max_context_tokens=4096)
    request = schema.to_chat_request({**BODY, "max_tokens": 4097}, "tiny", limits=limits)
    assert request.sampling.max_tokens == 4096
    body = {**BODY, "max_completion_tokens": 5000}
    assert schema.to_chat_request(body, "tiny", limits=limits).sampling.max_tokens == 4096
