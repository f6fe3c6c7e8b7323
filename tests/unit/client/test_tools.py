"""The SDK's tools: ``Tool`` and OpenAI's dicts as GenerateRequest fields, the tool choice's
forms, and streamed tool call parts joined into whole calls."""

from __future__ import annotations

import pytest

from epd.client import Tool, ToolCall, assistant, build_request, tool, user
from epd.client.messages import join, to_chunk
from epd.v1 import generation_pb2, route_service_pb2

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}}
WEATHER = Tool("get_weather", "today's weather", PARAMETERS, strict=True)
OPENAI_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "today's weather",
        "parameters": PARAMETERS,
        "strict": True,
    },
}


def test_a_tool_and_its_openai_dict_make_the_same_message() -> None:
    typed = build_request([user("hi")], tools=[WEATHER])
    openai = build_request([user("hi")], tools=[OPENAI_WEATHER])
    assert typed.tools == openai.tools
    (tool,) = typed.tools
    assert (tool.name, tool.description, tool.strict) == ("get_weather", "today's weather", True)
    assert tool.parameters["properties"]["city"]["maxLength"] == 40
    assert not build_request([user("hi")], tools=[Tool("f")]).tools[0].HasField("parameters")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", route_service_pb2.ToolChoice(mode=route_service_pb2.TOOL_CHOICE_MODE_NONE)),
        ("auto", route_service_pb2.ToolChoice(mode=route_service_pb2.TOOL_CHOICE_MODE_AUTO)),
        (
            "required",
            route_service_pb2.ToolChoice(mode=route_service_pb2.TOOL_CHOICE_MODE_REQUIRED),
        ),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            route_service_pb2.ToolChoice(function_name="get_weather"),
        ),
    ],
)
def test_each_tool_choice_form(choice: object, expected: route_service_pb2.ToolChoice) -> None:
    request = build_request([user("hi")], tools=[WEATHER], tool_choice=choice)  # type: ignore[arg-type]
    assert request.tool_choice == expected


def test_unset_options_leave_the_fields_unset() -> None:
    request = build_request([user("hi")])
    for name in ("tool_choice", "parallel_tool_calls", "chat_template_kwargs"):
        assert not request.HasField(name), name
    assert (list(request.tools), request.stream_interval) == ([], 0)


def test_the_other_options_land_in_their_fields() -> None:
    request = build_request(
        [user("hi")],
        parallel_tool_calls=False,
        chat_template_kwargs={"enable_thinking": False},
        stream_interval=4,
    )
    assert request.HasField("parallel_tool_calls") and not request.parallel_tool_calls
    assert dict(request.chat_template_kwargs) == {"enable_thinking": False}
    assert request.stream_interval == 4


def test_a_bad_tool_choice_or_tool_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="tool_choice 'sometimes'"):
        build_request([user("hi")], tool_choice="sometimes")
    with pytest.raises(ValueError, match="a tool is"):
        build_request([user("hi")], tools=[{"type": "code_interpreter"}])
    with pytest.raises(TypeError, match="unknown option"):
        build_request([user("hi")], tool=WEATHER)  # type: ignore[call-arg]


def test_streamed_tool_call_parts_join_into_whole_calls() -> None:
    parts = [
        route_service_pb2.GenerateResponse(text="Sure. "),
        route_service_pb2.GenerateResponse(
            reasoning="rain?",
            tool_calls=[route_service_pb2.ToolCall(index=0, id="c0", name="get_weather")],
        ),
        route_service_pb2.GenerateResponse(
            tool_calls=[
                route_service_pb2.ToolCall(index=0, arguments='{"city": '),
                route_service_pb2.ToolCall(index=1, id="c1", name="get_time", arguments="{}"),
            ]
        ),
        route_service_pb2.GenerateResponse(
            tool_calls=[route_service_pb2.ToolCall(index=0, arguments='"Paris"}')],
            finish_reason=generation_pb2.FINISH_REASON_TOOL_CALLS,
        ),
    ]
    answer = join([to_chunk(part) for part in parts])
    assert (answer.text, answer.reasoning, answer.finish_reason) == (
        "Sure. ",
        "rain?",
        "tool_calls",
    )
    assert answer.tool_calls == [
        ToolCall(0, "c0", "get_weather", '{"city": "Paris"}'),
        ToolCall(1, "c1", "get_time", "{}"),
    ]
    assert answer.tool_calls[0].parsed_arguments() == {"city": "Paris"}


def test_an_agent_turn_and_a_tool_result_become_their_messages() -> None:
    call = ToolCall(0, "c1", "get_weather", '{"city": "Paris"}')
    request = build_request(
        [
            user("weather?"),
            assistant(tool_calls=[call], reasoning="they ask"),
            tool("sunny", call_id="c1"),
            assistant("It is sunny."),
        ]
    )
    asked, called, result, answered = request.messages
    assert (called.role, list(called.content), called.reasoning) == ("assistant", [], "they ask")
    (sent,) = called.tool_calls
    assert (sent.id, sent.name, sent.arguments) == ("c1", "get_weather", '{"city": "Paris"}')
    assert (result.role, result.tool_call_id, result.content[0].text) == ("tool", "c1", "sunny")
    assert answered.content[0].text == "It is sunny." and not answered.tool_calls
