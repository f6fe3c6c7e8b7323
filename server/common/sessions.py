"""Server side of call sessions: many calls of one method over one long-lived bidirectional stream.

A new gRPC call costs about three times a message on a stream that is already open (0.8 ms
against 0.27 ms between two asyncio peers here), and a request crosses several services. So the
callers that call a service again and again (the route, prefill workers fetching embeddings) open
one ``*Session`` stream per service and method and send each call as a frame on it::

    caller -> server   {call_id, timeout_ms, request}   starts a call
    caller -> server   {call_id, cancel}                stops it (its work is cancelled)
    server -> caller   {call_id, response}              each response, as the method yields it
    server -> caller   {call_id, end}                   its status (absent after a unary's reply)

Each call runs the servicer's own method, unchanged, in its own task: its errors map to the same
codes and rich status as a per-call RPC (``CallEnd`` carries what the trailers would), its deadline
is the frame's ``timeout_ms``, and cancelling it cancels that task (an engine request is aborted).
Responses of all calls share the stream and its flow control: a caller that stops reading holds
back every call of its session. When the
server drains, new calls end UNAVAILABLE (reason DRAINING) and the stream closes once idle; calls
in flight finish within the drain's grace. A caller that goes away cancels every call it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from epd.server.common.errors import Unavailable
from epd.server.common.status import status_details, to_rpc_status
from epd.v1 import call_pb2

logger = logging.getLogger(__name__)

MAX_OPEN_CALLS = 4096

Handler = Callable[[Any, Any], Any]  # (request, context) -> response awaitable or async iterator
Final = Callable[[Any, int, Any], bool]  # (request, responses so far, response) -> is the last


class CallAborted(grpc.aio.AbortError):
    """A call of a session aborted by its handler (``context.abort*``), with its status."""

    def __init__(self, code: grpc.StatusCode, message: str, details: bytes = b"") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @classmethod
    def of(cls, status: grpc.Status) -> CallAborted:
        """The abort that ends a call with ``status`` (code, message, rich status)."""
        return cls(status.code, status.details, status_details(status.trailing_metadata))


class CallContext:
    """The servicer context of one call of a session: what handlers use of a per-call context."""

    def __init__(self, session: Any, timeout_s: float | None) -> None:
        self._session = session
        now = asyncio.get_running_loop().time()
        self._deadline = None if timeout_s is None else now + timeout_s

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Any = ()) -> None:  # fmt: skip
        """End this call (not the session) with ``code``. Always raises."""
        raise CallAborted(code, details, status_details(trailing_metadata))

    async def abort_with_status(self, status: grpc.Status) -> None:
        """End this call (not the session) with ``status``. Always raises."""
        raise CallAborted.of(status)

    def time_remaining(self) -> float | None:
        """Seconds left before the call's deadline, None without one."""
        if self._deadline is None:
            return None
        return max(self._deadline - asyncio.get_running_loop().time(), 0.0)

    def invocation_metadata(self) -> Any:
        """The session stream's metadata (the caller's, for every call of the session)."""
        return self._session.invocation_metadata()

    def peer(self) -> str:
        """The caller's address."""
        return str(self._session.peer())


class SessionDrain:
    """Shared by the sessions of one server: set when the server starts draining."""

    def __init__(self) -> None:
        self.draining = False
        self._sessions: set[_Session] = set()

    async def start(self) -> None:
        """Refuse new calls from now on and close sessions once idle (a drain callback)."""
        self.draining = True
        for session in self._sessions:
            session.wake()


async def serve_session(frames: AsyncIterator[Any], context: Any, handler: Handler,
                        response_type: type, drain: SessionDrain | None = None, *,
                        final: Final | None = None) -> None:  # fmt: skip
    """Run the calls ``frames`` start with ``handler`` (a servicer method, unary or server
    streaming), writing their frames of ``response_type`` through ``context``, until the caller
    closes its side and every call has ended (or the server drains and the session is idle).

    ``final(request, n, response)``: whether the n-th response (from 1) of a streaming call is
    its last; that response goes out marked ``last`` instead of being followed by a CallEnd, and
    the handler still runs to its end (what it yields after that is dropped with a warning)."""
    await _Session(context, handler, response_type, drain or SessionDrain(),
                   final).run(frames)  # fmt: skip


class _Session:
    def __init__(self, context: Any, handler: Handler, response_type: type,
                 drain: SessionDrain, final: Final | None) -> None:  # fmt: skip
        self.context = context
        self.handler = handler
        self.response_type = response_type
        self.drain = drain
        self.final = final
        self.calls: dict[int, asyncio.Task[None]] = {}
        self.changed = asyncio.Event()
        self.write_lock = asyncio.Lock()
        self.reading = True

    def wake(self) -> None:
        """Make ``run`` look at the session's state again (a call or the reader ended)."""
        self.changed.set()

    async def run(self, frames: AsyncIterator[Any]) -> None:
        await self.context.send_initial_metadata(())  # NOTE: the caller waits for it to write
        # NOTE: each call writes its own frames (one lock, no queue): a queue drained by another
        # task would cost a turn of the event loop per frame.
        reader = asyncio.create_task(self._read(frames))
        self.drain._sessions.add(self)
        try:
            while self.calls or (self.reading and not self.drain.draining):
                self.changed.clear()
                await self.changed.wait()
        finally:
            self.drain._sessions.discard(self)
            reader.cancel()
            for task in list(self.calls.values()):
                task.cancel()
            await asyncio.gather(reader, *self.calls.values(), return_exceptions=True)
            failure = None if reader.cancelled() else reader.exception()
            if failure is not None and not isinstance(failure, grpc.aio.AbortError):
                logger.warning("session stream from %s failed: %s", self.context.peer(), failure)

    async def _write(self, frame: Any) -> None:
        async with self.write_lock:
            await self.context.write(frame)

    async def _read(self, frames: AsyncIterator[Any]) -> None:
        try:
            async for frame in frames:
                kind = frame.WhichOneof("frame")
                if kind == "request":
                    self._start(frame)
                elif kind == "cancel" and (task := self.calls.pop(frame.call_id, None)):
                    task.cancel()
                    self.wake()
        except grpc.aio.AbortError:
            # NOTE: a frame aborted the stream (it did not parse): no call of it can answer now.
            for task in self.calls.values():
                task.cancel()
            raise
        finally:
            self.reading = False
            self.wake()

    def _start(self, frame: Any) -> None:
        call_id = frame.call_id
        refusal = None
        if self.drain.draining:
            refusal = Unavailable("the server is draining; call another one", reason="DRAINING")
        elif call_id in self.calls:
            refusal = Unavailable(f"call id {call_id} is already open in this session",
                                  reason="DUPLICATE_CALL_ID")  # fmt: skip
        elif len(self.calls) >= MAX_OPEN_CALLS:
            refusal = Unavailable(f"{MAX_OPEN_CALLS} calls already open in this session",
                                  reason="TOO_MANY_CALLS")  # fmt: skip
        if refusal is None:
            timeout_s = frame.timeout_ms / 1000 if frame.timeout_ms else None
            self.calls[call_id] = asyncio.create_task(self._call(call_id, frame.request,
                                                                 timeout_s))  # fmt: skip
            return
        end = _end_of(CallAborted.of(to_rpc_status(refusal)))
        # NOTE: in a task of its own, like a call: the reader never waits for the writer.
        self.calls[call_id] = asyncio.create_task(self._refuse(call_id, end))

    async def _refuse(self, call_id: int, end: call_pb2.CallEnd) -> None:
        try:
            await self._write(self.response_type(call_id=call_id, end=end))
        finally:
            self._forget(call_id)

    async def _call(self, call_id: int, request: Any, timeout_s: float | None) -> None:
        try:
            end = await self._run_call(call_id, request, timeout_s)
            if end is not None:
                await self._write(self.response_type(call_id=call_id, end=end))
        finally:
            self._forget(call_id)

    def _forget(self, call_id: int) -> None:
        """Drop the current task's call (a cancelled one was dropped when cancelled)."""
        if self.calls.get(call_id) is asyncio.current_task():
            del self.calls[call_id]
            self.wake()

    async def _run_call(self, call_id: int, request: Any,
                        timeout_s: float | None) -> call_pb2.CallEnd | None:  # fmt: skip
        """Run one call, writing its responses; its CallEnd (None after a ``last`` response)."""
        ended = False
        try:
            async with asyncio.timeout(timeout_s):
                result = self.handler(request, CallContext(self.context, timeout_s))
                if isinstance(result, Awaitable):
                    reply = await result
                    await self._write(self.response_type(call_id=call_id, response=reply,
                                                         last=True))  # fmt: skip
                    return None
                count = 0
                async with contextlib.aclosing(result) as responses:
                    async for response in responses:
                        count += 1
                        if ended:
                            logger.warning("a session call yielded after its last response; "
                                           "dropped")  # fmt: skip
                            continue
                        ended = self.final is not None and self.final(request, count, response)
                        await self._write(self.response_type(call_id=call_id, response=response,
                                                             last=ended))  # fmt: skip
            return None if ended else call_pb2.CallEnd()
        except Exception as error:
            if ended:
                logger.warning("a session call failed after its last response: %s", error)
                return None
            return _end_of(error)


def _end_of(error: Exception) -> call_pb2.CallEnd:
    if isinstance(error, CallAborted):
        return call_pb2.CallEnd(code=error.code.value[0], message=error.message,
                                status_details=error.details)  # fmt: skip
    if isinstance(error, TimeoutError):
        return call_pb2.CallEnd(code=grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                                message="Deadline Exceeded")  # fmt: skip
    logger.error("unexpected error in a session call", exc_info=error)
    return call_pb2.CallEnd(code=grpc.StatusCode.INTERNAL.value[0],
                            message="internal server error; see the server log")  # fmt: skip
