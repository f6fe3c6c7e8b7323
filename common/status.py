"""The one place where domain errors become gRPC statuses, and back.

Servers: decorate every servicer method with ``@handle_errors``. An ``EpdError`` aborts the call
with its canonical code and one ``google.rpc.ErrorInfo`` (reason, domain ``epd``, metadata) in the
rich status; any other exception is logged with its traceback and reported as INTERNAL with a
generic message, so no internals leak to callers.

Clients: ``from_rpc_error`` turns a failed call back into the matching ``EpdError`` subclass;
the route's clients (``clients``) apply it to every call, so its logic sees domain errors only.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from epd.common import errors
from epd.common.errors import Code, EpdError

logger = logging.getLogger(__name__)

ERROR_DOMAIN = "epd"
STATUS_DETAILS_KEY = "grpc-status-details-bin"

_GRPC_CODES: dict[Code, grpc.StatusCode] = {code: grpc.StatusCode[code.value] for code in Code}
_ERROR_CLASSES: dict[grpc.StatusCode, type[EpdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.UNIMPLEMENTED: errors.Unimplemented,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.CANCELLED: errors.Cancelled,
}

# The context every servicer method takes (epd's servicers read no request metadata types).
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
Method = TypeVar("Method", bound=Callable[..., Any])


def to_rpc_status(err: EpdError) -> grpc.Status:
    """Build the rich status for ``err``: its code, message and one ErrorInfo."""
    info = error_details_pb2.ErrorInfo(
        reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    code = _GRPC_CODES[err.code]
    status = status_pb2.Status(code=code.value[0], message=err.message, details=[detail])
    return cast(grpc.Status, rpc_status.to_status(status))


async def abort_with_error(context: grpc.aio.ServicerContext[Any, Any], err: Exception) -> None:
    """Abort the call for ``err`` (mapped as the module docstring says). Always raises."""
    if isinstance(err, EpdError):
        await context.abort_with_status(to_rpc_status(err))
    logger.error("unexpected error in RPC handler", exc_info=err)
    internal = errors.Internal("internal server error; see the server log")
    await context.abort_with_status(to_rpc_status(internal))


def handle_errors(method: Method) -> Method:
    """Decorate an async servicer method (unary, or a server-streaming async generator).

    ``EpdError`` -> abort with its rich status; ``grpc.aio.AbortError`` (the handler aborted
    the call itself) and ``asyncio.CancelledError`` (the caller went away) pass through
    untouched; any other exception -> logged with its traceback, INTERNAL with a generic message.
    """
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                # NOTE: aclosing runs the handler's finally blocks as soon as this wrapper is
                # closed (the call ended early), not whenever the inner generator is collected.
                async with contextlib.aclosing(method(self, request, context)) as items:
                    async for item in items:
                        yield item
            except grpc.aio.AbortError:
                raise
            except Exception as e:
                await abort_with_error(context, e)

        return cast(Method, stream)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await cast(Callable[..., Awaitable[Any]], method)(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await abort_with_error(context, e)

    return cast(Method, unary)


def status_details(trailing_metadata: Any) -> bytes:
    """The serialized rich status (google.rpc.Status) in trailing metadata; empty if none."""
    for key, value in trailing_metadata or ():
        if key == STATUS_DETAILS_KEY:
            return bytes(value)
    return b""


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """Return the ErrorInfo carried in a failed call's rich status, if any."""
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    details = status_details(trailers)
    if not details:
        return None
    for detail in status_pb2.Status.FromString(details).details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def from_rpc_error(err: grpc.RpcError, peer: str = "") -> EpdError:
    """Map a failed call back to the EpdError subclass of its code, keeping reason and metadata.

    ``peer``: the endpoint called; an UNAVAILABLE without ErrorInfo from it (the connection
    failed: the peer or the network to it is down) becomes reason PEER_UNREACHABLE naming it.
    """
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else None) or str(code)
    info = error_info(err)
    if info is None and peer and code == grpc.StatusCode.UNAVAILABLE:
        return errors.Unavailable(
            f"{peer} is unreachable: {message}",
            reason="PEER_UNREACHABLE",
            metadata={"endpoint": peer},
        )
    reason = info.reason if info is not None else code.name
    metadata = dict(info.metadata) if info is not None else {}
    error_class = _ERROR_CLASSES.get(code, errors.Internal)
    return error_class(message, reason=reason, metadata=metadata)
