"""A valid chat-completions body and the refusal check the OpenAI schema tests share."""

from __future__ import annotations

from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_answers
from epd.server.route import openai_schema as schema

BODY = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


def refusal(body: Any, limits: schema.RequestLimits | None = None) -> InvalidArgument:
    """The error ``body`` is refused with, after checking it maps to a 400 error object."""
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request(body, "tiny", limits=limits or schema.RequestLimits())
    status, error = openai_answers.error_body(caught.value)
    assert status == 400 and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["param"] == caught.value.metadata["param"]
    return caught.value


def user(content: Any) -> dict[str, Any]:
    """``BODY`` with one user message of ``content``."""
    return {**BODY, "messages": [{"role": "user", "content": content}]}
