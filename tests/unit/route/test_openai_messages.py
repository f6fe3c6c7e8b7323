"""OpenAI chat-completions bodies -> ChatRequest: messages (roles, parts, names) and the size
limits, refused naming where."""

from __future__ import annotations

from typing import Any

import pytest

from epd.server.route import openai_schema as schema
from tests.unit.route.chat_bodies import BODY, refusal, user


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "bad \ud800 text"}, "messages[0].content"),
        ({"role": "user", "content": [{"type": "text", "text": "\udc00"}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "text", "text": 42}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "text"}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "input_audio"}]}, "content[0]"),
        ({"role": "user", "content": [7]}, "content[0]"),
        ({"role": "user", "content": []}, "messages[0].content"),
        ({"role": "user", "content": None}, "messages[0].content"),
        ({"role": "user", "content": {"text": "hi"}}, "messages[0].content"),
        ({"role": "function", "content": "42"}, "messages[0].role"),
        ({"role": "us\ud800er", "content": "hi"}, "messages[0].role"),
        ({"role": ["user"], "content": "hi"}, "messages[0].role"),
        ({"content": "hi"}, "messages[0].role"),
        ({"role": "user", "name": 3, "content": "hi"}, "messages[0].name"),
        ({"role": "user", "content": "hi", "name": "\ud800"}, "messages[0].name"),
        ({"role": "user", "content": "hi", "name": "n" * 257}, "messages[0].name"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x\ud800"}}]},
            "image_url.url",
        ),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]},
            "content[0].image_url",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "u", "detail": 1}}],
            },
            "image_url.detail",
        ),
    ],
)
def test_a_malformed_message_is_refused_naming_where(message: Any, param: str) -> None:
    error = refusal({**BODY, "messages": [message]})
    assert error.metadata["param"].endswith(param)


def test_roles_and_fields_of_echoed_assistant_messages() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "hello", "tool_calls": None, "refusal": None},
        {"role": "user", "content": "again"},
    ]
    request = schema.to_chat_request({**BODY, "messages": messages}, "tiny")
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    calls = {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}
    error = refusal({**BODY, "messages": [*messages, calls]})
    assert error.metadata["param"] == "messages[4].tool_calls"
    unknown = {"role": "assistant", "content": "x", "audio": {"id": "a"}}
    error = refusal({**BODY, "messages": [*messages, unknown]})
    assert (error.reason, error.metadata["param"]) == ("UNSUPPORTED_PARAMETER", "messages[4].audio")


@pytest.mark.parametrize(
    ("body", "limits"),
    [
        ({**BODY, "messages": [{"role": "user", "content": "x"}] * 4}, {"max_messages": 3}),
        (user([{"type": "text", "text": "x"}] * 4), {"max_parts_per_message": 3}),
        (user("x" * 101), {"max_prompt_chars": 100}),
        (user([{"type": "image_url", "image_url": "http://i"}] * 3), {"max_images": 2}),
    ],
)
def test_sizes_beyond_the_limits_are_refused_before_any_work(
    body: Any, limits: dict[str, int]
) -> None:
    error = refusal(body, schema.RequestLimits(**limits))
    assert error.reason == "LIMIT_EXCEEDED" and error.metadata["param"].startswith("messages")
    assert schema.to_chat_request(body, "tiny").messages
