"""A GenerateRequest's tool fields, taken as the OpenAI door takes a body's (no I/O, no grpc).

The gRPC door's ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``chat_template_kwargs``,
``chat_template``, ``add_generation_prompt``, ``continue_final_message``, ``reasoning_effort``,
``documents`` and ``include_reasoning`` mean what an OpenAI body's fields of those names mean, and
so do its messages' ``tool_calls``, ``tool_call_id`` and ``reasoning`` (``add_turn_fields``).
``openai_fields`` writes them as vLLM's ``ChatCompletionRequest`` reads them, and ``add_tools`` has
vLLM check them and runs the OpenAI door's own step on the result (``tools.chat_step``): the
same refusals, the tools given to the chat template, the constraint a forced tool choice puts on the
output, and the ``AnswerParsing`` that splits the answer into content, reasoning and tool calls.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from epd.server.engine.vllm_inputs import structured_outputs
from epd.server.route.openai_schema import TOOL_ROLES, parse_with, template_fields
from epd.server.route.request import ChatRequest, bad
from epd.server.route.sampling import IS_VLLM_INSTALLED, structured_output_to_proto
from epd.server.route.tools import ToolCalling, chat_step
from epd.server.worker.convert import structured_output_from_proto
from epd.v1 import generation_pb2
from epd.v1 import route_service_pb2 as pb

MODES = {
    pb.TOOL_CHOICE_MODE_NONE: "none",
    pb.TOOL_CHOICE_MODE_AUTO: "auto",
    pb.TOOL_CHOICE_MODE_REQUIRED: "required",
}


def add_tools(
    chat: ChatRequest,
    request: pb.GenerateRequest,
    calling: ToolCalling | None,
    trust_chat_template: bool,
) -> None:
    """Give ``chat`` (``request.from_proto``'s of ``request``) what the OpenAI door's tool step
    makes of ``request``'s tool fields: its chat template arguments, its answer's parsing and
    the constraint its tool choice puts on its sampling. Nothing when ``request`` sets none of
    the fields and the route has no parser (``calling``: None)."""
    add_turn_fields(chat, request)
    fields = openai_fields(request)
    if not fields and calling is None:
        return
    if not IS_VLLM_INSTALLED:
        raise bad(
            f"{next(iter(fields))} needs vLLM on the route",
            next(iter(fields)),
            "UNSUPPORTED_PARAMETER",
        )
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    sampling = _parser_sampling(chat.sampling)
    parsed = parse_with(ChatCompletionRequest, {"messages": [], **fields, **sampling})
    param = "chat_template" if request.chat_template else "chat_template_kwargs"
    chat.template_kwargs, chat.answer_parsing = chat_step(
        parsed, calling, trust_chat_template, param
    )
    chat.chat_template = parsed.chat_template
    _adjust_sampling(chat.sampling, sampling, parsed)


def _parser_sampling(sampling: generation_pb2.SamplingParams) -> dict[str, Any]:
    """The fields of ``sampling`` vLLM's parsers read and adjust (a tool choice's constraint,
    special tokens kept for a parser that reads them), as vLLM's request holds them."""
    return {
        "structured_outputs": structured_outputs(structured_output_from_proto(sampling)),
        "skip_special_tokens": sampling.skip_special_tokens
        if sampling.HasField("skip_special_tokens")
        else True,
        "spaces_between_special_tokens": sampling.spaces_between_special_tokens
        if sampling.HasField("spaces_between_special_tokens")
        else True,
    }


def _adjust_sampling(
    sampling: generation_pb2.SamplingParams, given: dict[str, Any], parsed: Any
) -> None:
    """Write onto ``sampling`` what the parsers changed of ``given`` in ``parsed``."""
    if parsed.structured_outputs != given["structured_outputs"]:
        output = structured_output_to_proto(parsed.structured_outputs)
        assert output is not None  # NOTE: a parser adds or replaces a constraint, never drops one
        sampling.structured_output.CopyFrom(output)
    for name in ("skip_special_tokens", "spaces_between_special_tokens"):
        if getattr(parsed, name) != given[name]:
            setattr(sampling, name, getattr(parsed, name))


def add_turn_fields(chat: ChatRequest, request: pb.GenerateRequest) -> None:
    """Give each assistant and tool turn of ``chat`` what the OpenAI door gives the chat
    template beside its content (``openai_schema.template_fields``): an assistant's tool calls
    and reasoning, a tool result's call id and its text as one string."""
    for index, (message, turn) in enumerate(zip(request.messages, chat.messages, strict=True)):
        if message.role not in TOOL_ROLES:
            continue
        param = f"messages[{index}]"
        if message.tool_calls and not IS_VLLM_INSTALLED:
            raise bad("tool_calls need vLLM on the route", f"{param}.tool_calls")
        turn.template_fields = template_fields(
            _openai_turn(message), message.role, turn.parts, param
        )


def _openai_turn(message: pb.ChatMessage) -> dict[str, Any]:
    """``message``'s tool fields as an OpenAI message spells them (none: left out)."""
    turn: dict[str, Any] = {}
    if message.tool_calls:
        turn["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        turn["tool_call_id"] = message.tool_call_id
    if message.reasoning:
        turn["reasoning"] = message.reasoning
    return turn


def openai_fields(request: pb.GenerateRequest) -> dict[str, Any]:
    """``request``'s tool fields, chat template and its options and include_reasoning as an
    OpenAI chat body spells them (empty: none set)."""
    fields: dict[str, Any] = {}
    if request.tools:
        fields["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(request.tools)]
    choice = _tool_choice(request.tool_choice)
    if choice is not None:
        fields["tool_choice"] = choice
    if request.HasField("parallel_tool_calls"):
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    if request.HasField("chat_template_kwargs"):
        fields["chat_template_kwargs"] = json_object(request.chat_template_kwargs)
    for name in ("add_generation_prompt", "include_reasoning"):
        if request.HasField(name):
            fields[name] = getattr(request, name)
    if request.continue_final_message:
        fields["continue_final_message"] = True
    for name in ("chat_template", "reasoning_effort"):
        if getattr(request, name):
            fields[name] = getattr(request, name)
    if request.documents:
        fields["documents"] = [json_object(document) for document in request.documents]
    return fields


def _tool(tool: pb.Tool, param: str) -> dict[str, Any]:
    if not tool.name:
        raise bad("a tool needs its function's name", f"{param}.name")
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.HasField("parameters"):
        function["parameters"] = json_object(tool.parameters)
    if tool.HasField("strict"):
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _tool_choice(choice: pb.ToolChoice) -> str | dict[str, Any] | None:
    """OpenAI's ``tool_choice`` of ``choice`` (None: unset, OpenAI's default)."""
    kind = choice.WhichOneof("choice")
    if kind == "function_name":
        return {"type": "function", "function": {"name": choice.function_name}}
    if kind is None or choice.mode == pb.TOOL_CHOICE_MODE_UNSPECIFIED:
        return None
    if choice.mode not in MODES:
        raise bad(f"tool_choice.mode {choice.mode} is no ToolChoiceMode", "tool_choice.mode")
    return MODES[choice.mode]


def json_object(struct: struct_pb2.Struct) -> dict[str, Any]:
    """``struct`` as the JSON object it stands for. A Struct holds every number as a double;
    a whole one is read back as JSON text reads ``3``, an int, so that a JSON schema's
    ``maxItems`` or a template argument reaches vLLM and the chat template as over HTTP."""
    from google.protobuf.json_format import MessageToDict

    whole: dict[str, Any] = _whole_numbers(MessageToDict(struct))
    return whole


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value
