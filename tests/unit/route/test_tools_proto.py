"""A GenerateRequest's tool fields as an OpenAI body spells them (``tools_proto``): Struct
numbers read back as JSON reads them, the tool choice's forms, and a route without vLLM
refusing them by name."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from epd.common.errors import InvalidArgument
from epd.server.route import tools_proto
from epd.server.route.request import from_proto
from epd.v1 import route_service_pb2 as pb


def struct(value: dict[str, object]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(value)
    return message


def test_whole_numbers_come_back_as_ints_and_the_rest_as_they_were() -> None:
    value = {"maxItems": 3, "minimum": 1.5, "enum": [1, "a", None, True], "nested": {"n": 0}}
    assert tools_proto.json_object(struct(value)) == value
    assert type(tools_proto.json_object(struct(value))["maxItems"]) is int


def test_the_fields_as_an_openai_body_spells_them() -> None:
    request = pb.GenerateRequest(
        tools=[pb.Tool(name="f", description="d", parameters=struct({"type": "object"}))],
        tool_choice=pb.ToolChoice(function_name="f"),
        parallel_tool_calls=False,
        chat_template_kwargs=struct({"enable_thinking": False}),
    )
    assert tools_proto.openai_fields(request) == {
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    unspecified = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_UNSPECIFIED)
    assert tools_proto.openai_fields(pb.GenerateRequest(tool_choice=unspecified)) == {}
    required = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)
    assert tools_proto.openai_fields(pb.GenerateRequest(tool_choice=required)) == {
        "tool_choice": "required"
    }


def test_an_unknown_mode_is_refused_by_name() -> None:
    choice = pb.ToolChoice(mode=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as raised:
        tools_proto.openai_fields(pb.GenerateRequest(tool_choice=choice))
    assert raised.value.metadata["param"] == "tool_choice.mode"


def test_without_vllm_tool_fields_are_refused_and_plain_requests_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools_proto, "IS_VLLM_INSTALLED", False)
    request = pb.GenerateRequest(tools=[pb.Tool(name="f")])
    with pytest.raises(InvalidArgument) as raised:
        tools_proto.add_tools(from_proto(request), request, None, False)
    assert (raised.value.reason, raised.value.metadata["param"]) == (
        "UNSUPPORTED_PARAMETER",
        "tools",
    )
    plain = pb.GenerateRequest()
    chat = from_proto(plain)
    tools_proto.add_tools(chat, plain, None, False)
    assert chat.answer_parsing is None and chat.template_kwargs == {}


def test_earlier_calls_and_results_get_the_openai_doors_template_fields() -> None:
    from epd.server.route.openai_schema import to_chat_request

    arguments = '{"city": "Paris", "days": 2}'
    body = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning": "they ask",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
            {"role": "assistant", "content": "It is sunny."},
        ]
    }
    text = [pb.ContentPart(text="weather?")]
    request = pb.GenerateRequest(
        messages=[
            pb.ChatMessage(role="user", content=text),
            pb.ChatMessage(
                role="assistant",
                reasoning="they ask",
                tool_calls=[pb.ToolCall(id="c1", name="f", arguments=arguments)],
            ),
            pb.ChatMessage(role="tool", tool_call_id="c1", content=[pb.ContentPart(text="sunny")]),
            pb.ChatMessage(role="assistant", content=[pb.ContentPart(text="It is sunny.")]),
        ]
    )
    chat = from_proto(request)
    tools_proto.add_tools(chat, request, None, False)
    expected = [turn.template_fields for turn in to_chat_request(body, "tiny").messages]
    assert [turn.template_fields for turn in chat.messages] == expected
    (call,) = expected[1]["tool_calls"]
    assert call["function"]["arguments"] == {"city": "Paris", "days": 2}  # NOTE: as vLLM gives it
    assert expected[2] == {"tool_call_id": "c1", "content": "sunny"}
