"""OpenAI chat-completions bodies -> GenerateRequest: request ids, sampling, refusals."""

from __future__ import annotations

import pytest

from epd.server.common.errors import InvalidArgument
from epd.server.route import openai_schema as schema

BODY = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


def test_the_x_request_id_header_names_the_request_and_the_completion() -> None:
    request = schema.to_generate_request(BODY, "tiny", "bench-7f3a-12")
    assert request.request_id == "bench-7f3a-12"
    assert schema.completion(request.request_id, "tiny", "x", 0, None)["id"] == (
        "chatcmpl-bench-7f3a-12")
    assert schema.chunk(request.request_id, "tiny", {}, None)["id"] == "chatcmpl-bench-7f3a-12"


def test_without_the_header_each_request_gets_a_fresh_id() -> None:
    first = schema.to_generate_request(BODY, "tiny").request_id
    assert first and first != schema.to_generate_request(BODY, "tiny").request_id


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "id\n", "ü"])
def test_a_malformed_request_id_is_a_bad_request(bad: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        schema.to_generate_request(BODY, "tiny", bad)
    assert caught.value.reason == "BAD_REQUEST"
    assert caught.value.metadata["param"] == "X-Request-Id"
    assert schema.error_body(caught.value)[0] == 400


def test_vllm_extensions_reach_the_sampling_parameters() -> None:
    body = {**BODY, "ignore_eos": True, "top_k": 5, "stop_token_ids": [7], "seed": 3,
            "stop": "END"}  # fmt: skip
    sampling = schema.to_generate_request(body, "tiny").sampling
    assert (sampling.ignore_eos, sampling.top_k, list(sampling.stop_token_ids)) == (True, 5, [7])
    assert (sampling.seed, list(sampling.stop), sampling.max_tokens) == (3, ["END"], 3)
