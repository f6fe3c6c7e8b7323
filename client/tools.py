"""Tools in the SDK: the functions a request offers the model (``Tool``, or OpenAI's dicts), the
tool choice, and the calls an answer carries (``ToolCall``), with their protobuf forms."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epd.v1 import route_service_pb2

# tool_choice modes, as OpenAI's API names them
TOOL_CHOICE_MODES = {
    "none": route_service_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": route_service_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": route_service_pb2.TOOL_CHOICE_MODE_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call: its ``name``, what it does (``description``), its
    ``parameters`` as a JSON schema, and whether its call must follow them exactly (``strict``;
    None: the route's tool parser's default)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    strict: bool | None = None

    @classmethod
    def from_openai(cls, tool: Mapping[str, Any]) -> Tool:
        """The ``Tool`` of an OpenAI ``tools`` entry (``{"type": "function", "function":
        {...}}``); ValueError for another type."""
        if tool.get("type", "function") != "function" or "function" not in tool:
            raise ValueError(f"a tool is {{'type': 'function', 'function': {{...}}}}, not {tool}")
        function = tool["function"]
        return cls(
            function["name"],
            function.get("description") or "",
            function.get("parameters"),
            function.get("strict"),
        )

    def to_proto(self) -> route_service_pb2.Tool:
        """The ``Tool`` message."""
        message = route_service_pb2.Tool(name=self.name, description=self.description)
        if self.parameters is not None:
            message.parameters.update(self.parameters)
        if self.strict is not None:
            message.strict = self.strict
        return message


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made (``index``: which call of its answer), or, in a streamed
    ``Chunk``, part of one: its first part carries ``id`` and ``name``, each part more of its
    ``arguments`` (JSON text). A joined answer's calls are whole."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""

    def parsed_arguments(self) -> Any:
        """The whole call's arguments as a JSON value."""
        return json.loads(self.arguments)


def add_tool_fields(request: route_service_pb2.GenerateRequest, options: Mapping[str, Any]) -> None:
    """Set ``request``'s tool fields of ``options`` (``RequestOptions``' tools, tool_choice,
    parallel_tool_calls, chat_template_kwargs, stream_interval); ValueError for a tool choice
    that is none of OpenAI's forms."""
    tools: Sequence[Tool | Mapping[str, Any]] = options.get("tools") or ()
    for tool in tools:
        typed = tool if isinstance(tool, Tool) else Tool.from_openai(tool)
        request.tools.append(typed.to_proto())
    if options.get("tool_choice") is not None:
        request.tool_choice.CopyFrom(_tool_choice(options["tool_choice"]))
    if options.get("parallel_tool_calls") is not None:
        request.parallel_tool_calls = options["parallel_tool_calls"]
    if options.get("chat_template_kwargs") is not None:
        request.chat_template_kwargs.update(options["chat_template_kwargs"])
    request.stream_interval = options.get("stream_interval") or 0


def _tool_choice(choice: str | Mapping[str, Any]) -> route_service_pb2.ToolChoice:
    if isinstance(choice, str):
        if choice not in TOOL_CHOICE_MODES:
            raise ValueError(
                f"tool_choice {choice!r}: none, auto, required, or "
                "{'type': 'function', 'function': {'name': ...}}"
            )
        return route_service_pb2.ToolChoice(mode=TOOL_CHOICE_MODES[choice])
    return route_service_pb2.ToolChoice(function_name=choice["function"]["name"])


def to_tool_calls(calls: Sequence[route_service_pb2.ToolCall]) -> list[ToolCall]:
    """The SDK's view of a response's tool call parts."""
    return [ToolCall(call.index, call.id, call.name, call.arguments) for call in calls]


def joined_calls(parts: Sequence[ToolCall]) -> list[ToolCall]:
    """Whole calls of streamed ``parts``, by index: the first id, the name and arguments
    joined."""
    calls: dict[int, ToolCall] = {}
    for part in parts:
        call = calls.get(part.index, ToolCall(part.index))
        calls[part.index] = ToolCall(
            part.index,
            call.id or part.id,
            call.name + part.name,
            call.arguments + part.arguments,
        )
    return [calls[index] for index in sorted(calls)]
