"""One table of sampling defaults and one map of finish reasons, read by every side."""

from __future__ import annotations

from epd.client.messages import build_request, to_chunk, user
from epd.common.generation import (
    FINISH_REASONS,
    SAMPLING_DEFAULTS,
    finish_reason_name,
    finish_reason_value,
)
from epd.server.engine.base import Sampling, TokenChunk
from epd.server.route import openai_answers
from epd.server.route import openai_schema as schema
from epd.server.worker.convert import chunk_fields, sampling_from_proto
from epd.v1 import generation_pb2, route_service_pb2


def test_every_side_reads_the_same_sampling_defaults() -> None:
    engine = Sampling()
    unset = sampling_from_proto(generation_pb2.SamplingParams())
    assert engine == unset
    assert (engine.max_tokens, engine.temperature, engine.top_p, engine.top_k) == (
        SAMPLING_DEFAULTS.max_tokens,
        SAMPLING_DEFAULTS.temperature,
        SAMPLING_DEFAULTS.top_p,
        SAMPLING_DEFAULTS.top_k,
    )
    from_sdk = build_request([user("hi")]).sampling
    assert from_sdk.max_tokens == 0  # unset: the route gives it the same default as over HTTP
    assert (from_sdk.temperature, from_sdk.top_p, from_sdk.top_k) == (
        SAMPLING_DEFAULTS.temperature,
        SAMPLING_DEFAULTS.top_p,
        SAMPLING_DEFAULTS.top_k,
    )


def test_over_http_the_defaults_are_those_of_vllms_openai_server() -> None:
    """A body without sampling fields samples at temperature 1, as ``vllm serve`` does (the
    model's generation config aside); gRPC's empty SamplingParams stays greedy."""
    body = {"messages": [{"role": "user", "content": "hi"}]}
    over_http = schema.to_chat_request(body, "tiny").sampling
    assert over_http.max_tokens == SAMPLING_DEFAULTS.max_tokens  # the context unknown here
    assert (over_http.temperature, over_http.top_p, over_http.top_k) == (1.0, 1.0, 0)


def test_finish_reasons_go_both_ways_through_one_map() -> None:
    for name, value in FINISH_REASONS.items():
        assert finish_reason_name(finish_reason_value(name)) == name
        assert chunk_fields(TokenChunk([1], name))["finish_reason"] == value
        assert to_chunk(route_service_pb2.GenerateResponse(finish_reason=value)).finish_reason == (
            name
        )
        assert openai_answers.chunk("r", "tiny", {}, value)["choices"][0]["finish_reason"] == name
        assert openai_answers.completion("r", "tiny", [openai_answers.Answer(finish=value)])[
            "choices"
        ][0]["finish_reason"] == (name)
    assert finish_reason_value(None) == generation_pb2.FINISH_REASON_UNSPECIFIED
    assert finish_reason_name(generation_pb2.FINISH_REASON_UNSPECIFIED) is None
