"""Requests that do not parse answer INVALID_ARGUMENT (reason BAD_MESSAGE) on every RPC.

gRPC deserializes a request before any servicer code runs; a ``DecodeError`` there (garbage bytes,
a string field that is not UTF-8) would end the call UNKNOWN with a traceback in the log. The
interceptor ``build_server`` installs rewraps each method handler once: its deserializer turns a
``DecodeError`` into a ``BadMessage``, and its behaviour aborts the call on one, logging one line.
A streamed request's bad frame aborts the call when the servicer reaches it in its request
iterator (servicers read frames through the iterator, not ``context.read``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from epd.common.errors import InvalidArgument
from epd.common.status import to_rpc_status

logger = logging.getLogger(__name__)

REASON = "BAD_MESSAGE"
Behaviour = Callable[[Any, Any], Any]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
_HANDLER_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


@dataclass(frozen=True, slots=True)
class BadMessage:
    """What the deserializer returns for bytes that do not parse, in place of a request."""

    error: str


class BadMessageInterceptor(grpc.aio.ServerInterceptor):
    """Answer INVALID_ARGUMENT to requests that do not parse, whatever the service.

    Installed last (innermost), so it sees the handlers as registered; async handlers only (a
    synchronous one is left as it is). Each method's rewrapped handler is built once and kept."""

    def __init__(self) -> None:
        self._handlers: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._handlers.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        checked = checked_handler(handler, method)
        self._handlers[method] = (handler, checked)
        return checked


def checked_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with requests that do not parse answered INVALID_ARGUMENT (see the module)."""
    deserializer = handler.request_deserializer
    behaviour = (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )
    if deserializer is None or not _is_async(behaviour):
        return handler
    if handler.request_streaming:
        checked = _checking_frames(behaviour, method)
    else:
        checked = _checking_request(behaviour, method)
    factory = _HANDLER_FACTORIES[(handler.request_streaming, handler.response_streaming)]
    return factory(
        checked,
        request_deserializer=_parser(deserializer),
        response_serializer=handler.response_serializer,
    )


def _parser(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as e:
            return BadMessage(str(e))

    return parse


def _checking_request(behaviour: Behaviour, method: str) -> Behaviour:
    """``behaviour`` (unary request) aborting on a ``BadMessage`` before it runs."""
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, BadMessage):
                await _reject(request, context, method)
            async with aclosing(behaviour(request, context)) as responses:
                async for response in responses:
                    yield response

        return stream

    async def unary(request: Any, context: Any) -> Any:
        if isinstance(request, BadMessage):
            await _reject(request, context, method)
        return await behaviour(request, context)

    return unary


def _checking_frames(behaviour: Behaviour, method: str) -> Behaviour:
    """``behaviour`` (streamed request) reading frames that abort the call on a ``BadMessage``."""
    if inspect.isasyncgenfunction(behaviour):

        async def stream(frames: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            checked = _checked_frames(frames, context, method)
            async with aclosing(behaviour(checked, context)) as responses:
                async for response in responses:
                    yield response

        return stream

    async def unary(frames: AsyncIterator[Any], context: Any) -> Any:
        return await behaviour(_checked_frames(frames, context, method), context)

    return unary


async def _checked_frames(
    frames: AsyncIterator[Any], context: Any, method: str
) -> AsyncIterator[Any]:
    async for frame in frames:
        if isinstance(frame, BadMessage):
            await _reject(frame, context, method)
        yield frame


async def _reject(message: BadMessage, context: Any, method: str) -> NoReturn:
    logger.warning(
        "request to %s from %s does not parse: %s", method, context.peer(), message.error
    )
    error = InvalidArgument(
        f"the request does not parse: {message.error}", reason=REASON, metadata={"method": method}
    )
    await context.abort_with_status(to_rpc_status(error))
    raise AssertionError("abort_with_status returned")  # NOTE: unreachable; it always raises


def _is_async(behaviour: Behaviour | None) -> bool:
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)
