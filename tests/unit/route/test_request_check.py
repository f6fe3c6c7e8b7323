"""The one check of a ChatRequest both doors make: refusals, and the defaults it fills in.
(Both doors judging a corpus alike: tests/grpc/route/test_request_doors.py.)"""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.common.generation import SAMPLING_DEFAULTS
from epd.server.route.request import ChatRequest, from_proto
from epd.server.route.request_check import RequestLimits, check_request
from epd.v1 import generation_pb2, route_service_pb2


def chat(*messages: tuple[str, list[str]], max_tokens: int = 0) -> ChatRequest:
    """A ChatRequest as the gRPC door makes it."""
    return from_proto(
        route_service_pb2.GenerateRequest(
            messages=[
                route_service_pb2.ChatMessage(
                    role=role, content=[route_service_pb2.ContentPart(text=t) for t in texts]
                )
                for role, texts in messages
            ],
            sampling=generation_pb2.SamplingParams(max_tokens=max_tokens),
        )
    )


def refusal(request: ChatRequest, **limits: int) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        check_request(request, RequestLimits(**limits))
    return caught.value


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (chat(), "EMPTY_CHAT"),
        (chat(("robot", ["hi"])), "BAD_ROLE"),
        (chat(("user", [])), "EMPTY_MESSAGE"),
    ],
)
def test_bad_chats_are_invalid_arguments(request_: ChatRequest, reason: str) -> None:
    assert refusal(request_).reason == reason


def test_a_chat_over_the_character_limit_is_refused_whatever_its_door() -> None:
    error = refusal(chat(("system", ["x" * 60]), ("user", ["y" * 41])), max_prompt_chars=100)
    assert (error.reason, error.metadata["param"]) == ("LIMIT_EXCEEDED", "messages")
    assert "101 characters" in error.message and "100" in error.message


def test_roles_get_the_names_chat_templates_know() -> None:
    request = chat(("developer", ["be brief"]), ("user", ["hi"]), ("assistant", ["hello"]))
    check_request(request, RequestLimits())
    assert [m.role for m in request.messages] == ["system", "user", "assistant"]


def test_an_unset_max_tokens_gets_the_context_or_the_default_where_it_is_unknown() -> None:
    request = chat(("user", ["hi"]))
    check_request(request, RequestLimits().with_context(4096))
    assert request.sampling.max_tokens == 4096
    request = chat(("user", ["hi"]))
    check_request(request, RequestLimits())
    assert request.sampling.max_tokens == SAMPLING_DEFAULTS.max_tokens == 16
    request = chat(("user", ["hi"]), max_tokens=7)
    check_request(request, RequestLimits().with_context(4096))
    assert request.sampling.max_tokens == 7


def test_max_tokens_beyond_the_context_is_refused() -> None:
    """(The HTTP door gives such a body the rest of the context, as vLLM: ``answer_bound``.)"""
    request = chat(("user", ["hi"]), max_tokens=4097)
    with pytest.raises(InvalidArgument) as caught:
        check_request(request, RequestLimits(max_context_tokens=4096))
    assert caught.value.metadata["param"] == "max_tokens"
    assert "4097" in caught.value.message and "4096 tokens" in caught.value.message


def test_limits_keep_a_context_they_name() -> None:
    assert RequestLimits(max_context_tokens=100).with_context(4096).max_context_tokens == 100
    assert RequestLimits().with_context(None).max_context_tokens is None
