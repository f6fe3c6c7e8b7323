"""Tools and reasoning through both doors of one route: the same chat sent to the OpenAI HTTP
port and to gRPC ``RouteService.Generate``, over one Router whose engine (a fake) answers with a
hermes tool call or a deepseek_r1 reasoning, gets the same prompt, the same sampling, the same
tool calls, reasoning, content and finish reason, and the same refusals; the SDK returns them
typed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from epd.client import AsyncEpdClient, EpdClientError, Tool, ToolCall, assistant, tool, user
from epd.client.messages import join
from epd.server.route.tools import AUTO_NEEDS_FLAGS, UNTRUSTED_TEMPLATE
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc
from tests.grpc.route.door_answers import grpc_answer, grpc_tool, http_answer
from tests.grpc.route.doors import PARAMETERS, QUESTION, TOOL, Doors


async def test_a_tool_call_is_the_openai_doors(hermes: Doors) -> None:
    status, streamed = await hermes.post({"tools": [TOOL], "stream": True})
    http_prompt = list(hermes.last_call().prompt.token_ids)
    responses = await hermes.generate(tools=[grpc_tool()])
    assert status == 200, streamed
    answer = grpc_answer(responses)
    assert answer == http_answer(streamed)
    assert answer == ("Sure. ", "", [(0, "get_weather", '{"city": "Paris"}')], "tool_calls")
    (first,) = [call for response in responses for call in response.tool_calls if call.id]
    assert first.id.startswith("chatcmpl-tool-") and first.name == "get_weather"
    # NOTE: the tools reach the chat template alike, a whole number in their schema included
    assert list(hermes.last_call().prompt.token_ids) == http_prompt
    assert hermes.last_call().sampling.HasField("skip_special_tokens")  # NOTE: hermes reads them
    status, whole = await hermes.post({"tools": [TOOL]})
    (call,) = json.loads(whole)["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == answer[2][0][1:]


@pytest.mark.parametrize(
    ("http_choice", "grpc_choice"),
    [
        ("required", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            pb.ToolChoice(function_name="get_weather"),
        ),
        ("none", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)),
    ],
    ids=["required", "named", "none"],
)
async def test_a_tool_choice_constrains_and_parses_as_the_openai_door(
    hermes: Doors, http_choice: Any, grpc_choice: pb.ToolChoice
) -> None:
    status, streamed = await hermes.post(
        {"tools": [TOOL], "tool_choice": http_choice, "parallel_tool_calls": False, "stream": True}
    )
    http_sampling = hermes.last_call().sampling
    responses = await hermes.generate(
        tools=[grpc_tool()], tool_choice=grpc_choice, parallel_tool_calls=False
    )
    assert status == 200, streamed
    assert grpc_answer(responses) == http_answer(streamed)
    sampling = hermes.last_call().sampling
    assert sampling.structured_output == http_sampling.structured_output
    assert sampling.HasField("structured_output") == (http_choice != "none")
    # NOTE: hermes keeps special tokens in the text it parses, whichever door
    assert sampling.skip_special_tokens == http_sampling.skip_special_tokens
    assert sampling.HasField("skip_special_tokens") == (http_choice != "none")


async def test_reasoning_is_the_openai_doors(deepseek: Doors) -> None:
    status, streamed = await deepseek.post({"stream": True})
    responses = await deepseek.generate()
    assert status == 200, streamed
    answer = grpc_answer(responses)
    assert answer == http_answer(streamed)
    assert answer == ("It is sunny.", "the sky is clear", [], "stop")


async def test_chat_template_kwargs_reach_the_template_as_over_http(deepseek: Doors) -> None:
    kwargs = {"enable_thinking": False, "documents_title": "notes"}
    await deepseek.post({"chat_template_kwargs": kwargs})
    http_prompt = list(deepseek.last_call().prompt.token_ids)
    struct = struct_pb2.Struct()
    struct.update(kwargs)
    await deepseek.generate(chat_template_kwargs=struct)
    assert list(deepseek.last_call().prompt.token_ids) == http_prompt


async def test_earlier_tool_calls_and_results_reach_the_template_as_over_http(
    hermes: Doors,
) -> None:
    arguments = '{"city": "Paris"}'
    call = {"name": "get_weather", "arguments": arguments}
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "reasoning": "they ask about Paris",
            "tool_calls": [{"id": "call-1", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call-1", "content": "sunny"},
    ]
    status, text = await hermes.post({"tools": [TOOL], "messages": history})
    http_prompt = list(hermes.last_call().prompt.token_ids)
    turns = [
        pb.ChatMessage(role="user", content=[pb.ContentPart(text="weather in Paris?")]),
        pb.ChatMessage(
            role="assistant",
            reasoning="they ask about Paris",
            tool_calls=[pb.ToolCall(id="call-1", name="get_weather", arguments=arguments)],
        ),
        pb.ChatMessage(role="tool", tool_call_id="call-1", content=[pb.ContentPart(text="sunny")]),
    ]
    await hermes.generate(tools=[grpc_tool()], messages=turns)
    assert status == 200, text
    prompt = list(hermes.last_call().prompt.token_ids)
    assert prompt == http_prompt
    rendered = hermes.tokenizer.decode(prompt)
    assert "sunny" in rendered  # NOTE: the tiny model's template leaves tool calls out


# (name, OpenAI body fields, GenerateRequest fields): both doors refuse them alike.
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("auto without the flags", {"tools": [TOOL]}, {"tools": [grpc_tool()]}),
    (
        "required without a parser",
        {"tools": [TOOL], "tool_choice": "required"},
        {"tools": [grpc_tool()], "tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)},
    ),
    (
        "a named tool that is not given",
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [grpc_tool()], "tool_choice": pb.ToolChoice(function_name="nope")},
    ),
    (
        "a tool choice without tools",
        {"tool_choice": "required"},
        {"tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)},
    ),
    (
        "an untrusted chat template",
        {"chat_template_kwargs": {"chat_template": "{{ messages }}"}},
        {
            "chat_template_kwargs": struct_pb2.Struct(
                fields={"chat_template": struct_pb2.Value(string_value="{{ messages }}")}
            )
        },
    ),
]


@pytest.mark.parametrize(("name", "body", "fields"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_bad_tool_request_is_refused_as_over_http(
    plain: Doors, name: str, body: dict[str, Any], fields: dict[str, Any]
) -> None:
    status, text = await plain.post(body)
    error = json.loads(text)["error"]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await plain.generate(**fields)
    refusal = EpdClientError.from_rpc_error(raised.value)
    assert status == 400 and refusal.code == "INVALID_ARGUMENT"
    assert (refusal.message, refusal.reason) == (error["message"], error["code"])
    if name == "auto without the flags":
        assert refusal.message == AUTO_NEEDS_FLAGS
    if name == "an untrusted chat template":
        assert refusal.message == UNTRUSTED_TEMPLATE


async def test_a_tool_without_a_name_is_refused(plain: Doors) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await plain.generate(tools=[pb.Tool(description="nameless")])
    refusal = EpdClientError.from_rpc_error(raised.value)
    assert (refusal.code, refusal.metadata["param"]) == ("INVALID_ARGUMENT", "tools[0].name")


async def test_the_sdk_returns_the_tool_call_and_reasoning_typed(
    hermes: Doors, deepseek: Doors
) -> None:
    status, whole = await hermes.post({"tools": [TOOL]})
    (expected,) = json.loads(whole)["choices"][0]["message"]["tool_calls"]
    async with AsyncEpdClient(hermes.grpc_endpoint) as client:
        typed = await client.generate([user("weather in Paris?")], max_tokens=64, tools=[TOOL])
        chunks = [
            chunk
            async for chunk in client.stream(
                [user("weather in Paris?")],
                max_tokens=64,
                tools=[Tool("get_weather", "today's weather", PARAMETERS)],
                tool_choice="auto",
            )
        ]
    assert status == 200
    (call,) = typed.tool_calls
    assert (typed.text, typed.finish_reason) == ("Sure. ", "tool_calls")
    assert (call.index, call.name, call.arguments) == (0, "get_weather", '{"city": "Paris"}')
    assert call.parsed_arguments() == json.loads(expected["function"]["arguments"])
    assert call.id.startswith("chatcmpl-tool-")
    assert sum(len(chunk.tool_calls) for chunk in chunks) > 1  # NOTE: parts, joined by generate
    assert join(chunks).tool_calls == [ToolCall(0, chunks_id(chunks), call.name, call.arguments)]
    # NOTE: the agent's next turn: the call and its result given back, as over HTTP
    history = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [{**expected, "id": call.id}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    await hermes.post({"tools": [TOOL], "messages": history})
    http_prompt = list(hermes.last_call().prompt.token_ids)
    turns = [user("weather in Paris?"), assistant(tool_calls=typed.tool_calls)]
    async with AsyncEpdClient(hermes.grpc_endpoint) as client:
        await client.generate([*turns, tool("sunny", call_id=call.id)], tools=[TOOL])
    assert list(hermes.last_call().prompt.token_ids) == http_prompt
    async with AsyncEpdClient(deepseek.grpc_endpoint) as client:
        thought = await client.generate([user("weather?")], max_tokens=64, stream_interval=3)
    assert (thought.reasoning, thought.text) == ("the sky is clear", "It is sunny.")


def chunks_id(chunks: list[Any]) -> str:
    """The id of a stream's (one) tool call."""
    (call_id,) = [call.id for chunk in chunks for call in chunk.tool_calls if call.id]
    return str(call_id)


async def test_the_grpcurl_example_of_the_docs_calls_the_tool(hermes: Doors) -> None:
    """docs/route.md's grpcurl request, read as grpcurl reads its JSON."""
    text = (Path(__file__).parents[3] / "docs" / "route.md").read_text()
    (command,) = [
        block for block in re.findall(r"```bash\n(.*?)```", text, re.S) if "tools" in block
    ]
    arguments = shlex.split(command.replace("\\\n", " "))
    request = json_format.Parse(arguments[arguments.index("-d") + 1], pb.GenerateRequest())
    assert arguments[-1] == "epd.v1.RouteService/Generate"
    async with grpc.aio.insecure_channel(hermes.grpc_endpoint) as channel:
        responses = [r async for r in pb_grpc.RouteServiceStub(channel).Generate(request)]
    assert grpc_answer(responses)[2:] == ([(0, "get_weather", '{"city": "Paris"}')], "tool_calls")
    assert all(len(response.token_ids) >= 32 for response in responses[1:-1])
