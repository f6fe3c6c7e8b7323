"""Asking the gRPC door and reading both doors' answers alike: content, reasoning, tool calls and
finish reason, or each choice's fields."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import struct_pb2

from epd.v1 import generation_pb2
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc
from tests.grpc.route.doors import PARAMETERS, Doors


def grpc_tool() -> pb.Tool:
    """The weather tool (``TOOL``) as a GenerateRequest's."""
    parameters = struct_pb2.Struct()
    parameters.update(PARAMETERS)
    return pb.Tool(name="get_weather", description="today's weather", parameters=parameters)


def http_answer(text: str) -> tuple[str, str, list[tuple[int, str, str]], str]:
    """A streamed OpenAI answer's content, reasoning, tool calls (index, name, arguments) and
    finish reason."""
    content, reasoning, finish = "", "", ""
    calls: dict[int, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        (choice,) = json.loads(line[6:])["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning") or ""
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            entry = calls.setdefault(call["index"], ["", ""])
            entry[0] += function.get("name") or ""
            entry[1] += function.get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return content, reasoning, [(i, *entry) for i, entry in sorted(calls.items())], finish


def grpc_answer(
    responses: list[pb.GenerateResponse],
) -> tuple[str, str, list[tuple[int, str, str]], str]:
    """The same of a gRPC answer."""
    calls: dict[int, list[str]] = {}
    for response in responses:
        for call in response.tool_calls:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += call.name
            entry[1] += call.arguments
    finish = generation_pb2.FinishReason.Name(responses[-1].finish_reason)
    return (
        "".join(response.text for response in responses),
        "".join(response.reasoning for response in responses),
        [(i, *entry) for i, entry in sorted(calls.items())],
        finish.removeprefix("FINISH_REASON_").lower(),
    )


def grpc_chat(chat: list[dict[str, str]]) -> list[pb.ChatMessage]:
    """``chat`` (OpenAI messages with text content) as GenerateRequest messages."""
    return [
        pb.ChatMessage(role=m["role"], content=[pb.ContentPart(text=m["content"])]) for m in chat
    ]


async def generate(
    doors: Doors, sampling: generation_pb2.SamplingParams, **fields: Any
) -> list[pb.GenerateResponse]:
    """``doors``' gRPC answer to the weather question (or ``fields``' messages) with
    ``sampling``."""
    fields.setdefault("messages", grpc_chat([{"role": "user", "content": "weather in Paris?"}]))
    request = pb.GenerateRequest(model="tiny", sampling=sampling, **fields)
    async with grpc.aio.insecure_channel(doors.grpc_endpoint) as channel:
        stub = pb_grpc.RouteServiceStub(channel)
        return [response async for response in stub.Generate(request, timeout=20)]


def http_choices(text: str) -> dict[int, dict[str, Any]]:
    """A streamed OpenAI chat answer's choices by index: content, finish reason, prompt_text,
    the deltas' contents in order and the number of tokens with logprobs."""
    choices: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        payload = json.loads(line[6:])
        for choice in payload["choices"]:
            entry = choices.setdefault(
                choice["index"],
                {"content": "", "finish": None, "prompt_text": None, "parts": [], "logprobs": 0},
            )
            entry["logprobs"] += len((choice.get("logprobs") or {}).get("content") or [])
            content = choice["delta"].get("content") or ""
            entry["content"] += content
            entry["parts"].append(content)
            entry["finish"] = choice["finish_reason"] or entry["finish"]
            if "prompt_text" in payload:
                entry["prompt_text"] = payload["prompt_text"]
    return choices


def grpc_choices(responses: list[pb.GenerateResponse]) -> dict[int, dict[str, Any]]:
    """The same of a gRPC answer (prompt_text: each completion's first chunk's)."""
    choices: dict[int, dict[str, Any]] = {}
    for response in responses:
        entry = choices.setdefault(
            response.index,
            {"content": "", "finish": None, "prompt_text": response.prompt_text, "parts": []},
        )
        entry["logprobs"] = entry.get("logprobs", 0) + len(response.logprobs)
        entry["content"] += response.text
        entry["parts"].append(response.text)
        if response.finish_reason:
            name = generation_pb2.FinishReason.Name(response.finish_reason)
            entry["finish"] = name.removeprefix("FINISH_REASON_").lower()
    return choices
