"""OpenAI chat-completions bodies -> ChatRequest: the request id (X-Request-Id or a fresh one)."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_answers
from epd.server.route import openai_schema as schema
from tests.unit.route.chat_bodies import BODY


def test_the_x_request_id_header_names_the_request_and_the_completion() -> None:
    request = schema.to_chat_request(BODY, "tiny", "bench-7f3a-12")
    assert request.request_id == "bench-7f3a-12"
    assert openai_answers.completion(request.request_id, "tiny", [openai_answers.Answer(["x"])])[
        "id"
    ] == ("chatcmpl-bench-7f3a-12")
    assert (
        openai_answers.chunk(request.request_id, "tiny", {}, None)["id"] == "chatcmpl-bench-7f3a-12"
    )


def test_without_the_header_each_request_gets_a_fresh_id() -> None:
    first = schema.to_chat_request(BODY, "tiny").request_id
    assert first and first != schema.to_chat_request(BODY, "tiny").request_id


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "id\n", "ü"])
def test_a_malformed_request_id_is_a_bad_request(bad: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request(BODY, "tiny", bad)
    assert caught.value.reason == "BAD_REQUEST"
    assert caught.value.metadata["param"] == "X-Request-Id"
    assert openai_answers.error_body(caught.value)[0] == 400
