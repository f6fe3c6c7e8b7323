"""The gRPC door's answer (no I/O, no grpc): each chunk of a request's completions as a
``GenerateResponse``. Where the request has an ``AnswerParsing`` (the route's tool or reasoning
parser, ``tools.chat_step``), its text is split into content, reasoning and tool call parts, and
its finish reason said, by the same vLLM parsers and in the same way as the OpenAI door's
stream; its chunks are gathered ``stream_interval`` tokens at a time as that door's are
(``stream_interval.batched``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from epd.common.generation import finish_reason_name, finish_reason_value
from epd.server.route.choices import Choice
from epd.server.route.request import ChatRequest
from epd.server.route.stream_interval import batched
from epd.server.route.tools_answer import AnswerParsing
from epd.v1 import route_service_pb2 as pb


async def responses(
    chat: ChatRequest, choices: AsyncIterator[Choice]
) -> AsyncIterator[pb.GenerateResponse]:
    """``chat``'s answer, one ``GenerateResponse`` per (gathered) chunk of ``choices``, after a
    chunk per completion with its echo (vLLM's ``echo``) when ``chat`` has one."""
    if chat.stream_interval > 1:
        choices = batched(choices, chat.stream_interval)
    echoes = _echoes(chat)
    async for choice in choices:
        for echo in echoes:  # NOTE: as the OpenAI stream, once the answer's first chunk came
            yield echo
        echoes = []
        yield response(chat, choice)


def _echoes(chat: ChatRequest) -> list[pb.GenerateResponse]:
    """A chunk per completion of ``chat`` carrying its echo alone (none without one)."""
    if not chat.echo:
        return []
    return [
        pb.GenerateResponse(request_id=chat.request_id, text=chat.echo, index=index)
        for index in range(max(chat.sampling.n, 1))
    ]


def response(chat: ChatRequest, choice: Choice) -> pb.GenerateResponse:
    """The ``GenerateResponse`` of ``choice``'s chunk."""
    chunk = choice.chunk
    message = pb.GenerateResponse(
        request_id=chat.request_id,
        text=chunk.text,
        token_ids=chunk.token_ids,
        finish_reason=chunk.finish_reason,  # type: ignore[arg-type]
        logprobs=chunk.logprobs,
        index=choice.index,
        prompt_logprobs=chunk.prompt_logprobs,
        prompt_text=chunk.prompt_text or "",
    )
    if chat.return_token_ids and chunk.prompt_token_ids is not None:
        message.prompt_token_ids.extend(chunk.prompt_token_ids)
    if chunk.usage is not None:
        message.usage.CopyFrom(chunk.usage)
    if chat.answer_parsing is not None:
        _parse(chat.answer_parsing, choice, message)
    return message


def _parse(parsing: AnswerParsing, choice: Choice, message: pb.GenerateResponse) -> None:
    """``message``'s text split as the parser splits its chunk (none of it while the parser
    holds it back), and its finish reason as the parser says it."""
    chunk = choice.chunk
    if chunk.prompt_token_ids is not None:
        parsing.prompt_token_ids = chunk.prompt_token_ids
    finish = finish_reason_name(chunk.finish_reason)
    delta = parsing.delta(choice.index, chunk.text, list(chunk.token_ids), finish) or {}
    message.text = delta.get("content") or ""
    message.reasoning = delta.get("reasoning") or ""
    message.tool_calls.extend(_tool_call(call) for call in delta.get("tool_calls") or [])
    if finish is not None:
        message.finish_reason = finish_reason_value(  # type: ignore[assignment]
            parsing.finish_reason(choice.index, finish)
        )


def _tool_call(call: dict[str, Any]) -> pb.ToolCall:
    """A part of a tool call, from vLLM's ``DeltaToolCall`` (dumped)."""
    function = call.get("function") or {}
    return pb.ToolCall(
        index=call.get("index") or 0,
        id=call.get("id") or "",
        name=function.get("name") or "",
        arguments=function.get("arguments") or "",
    )
