"""Client side of call sessions (``sessions`` has the protocol): calls sent as frames on one
long-lived stream per peer and method, looking to the caller exactly like per-call RPCs.

``CallSession(stub.EncodeSession, stub.Encode, pb.EncodeSessionRequest)(request, timeout=...)``
returns a call to iterate (or, for a unary method, to await) whose failures raise
``grpc.aio.AioRpcError`` with the code and rich status a per-call RPC would carry, and whose
``cancel()`` stops the work on the server. The stream opens on the first call and again after it
breaks; a break fails the calls in flight with its status (UNAVAILABLE when the server went away),
so callers retry as they would after a failed RPC. A server without the session method
(UNIMPLEMENTED) is called per call from then on, the calls in flight included.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import grpc

from epd.server.common.status import STATUS_DETAILS_KEY
from epd.v1 import call_pb2

logger = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Fallback:
    """Delivered to the calls in flight when the server has no session method: they run per
    call."""


class SessionCall:
    """One call on a session: async-iterate its responses (await it when unary); ``cancel()``
    stops it. The request frame is written when the caller first reads."""

    def __init__(self, session: CallSession, call_id: int, request: Any,
                 timeout: float | None) -> None:  # fmt: skip
        self._session = session
        self.call_id = call_id
        self._request = request
        self._deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        self._frames: asyncio.Queue[Any] = asyncio.Queue()
        self._per_call: Any = None
        self._sent = self._done = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    def __await__(self) -> Generator[Any, None, Any]:
        """The reply of a unary call."""
        return self._reply().__await__()

    async def read(self) -> Any:
        """The next response, or ``grpc.aio.EOF`` after the last one."""
        if self._per_call is not None:
            return await (self._per_call if self._session.unary else self._per_call.read())
        if self._done and self._frames.empty():
            return grpc.aio.EOF
        try:
            async with asyncio.timeout_at(self._deadline):
                if not self._sent:
                    self._sent = True
                    await self._session._write_request(self)
                frame = await self._frames.get()
        except TimeoutError:
            self.cancel()
            raise _status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            self.cancel()
            raise
        response = self._take(frame)
        return await self.read() if response is None else response

    def cancel(self) -> bool:
        """Stop the call on the server; False when it had already ended."""
        if self._per_call is not None:
            return bool(self._per_call.cancel())
        if self._done:
            return False
        self._done = True
        self._session._cancel(self.call_id, sent=self._sent)
        return True

    def done(self) -> bool:
        """True once the call has ended (or was cancelled)."""
        return self._done if self._per_call is None else bool(self._per_call.done())

    def _take(self, frame: Any) -> Any:
        """The response in ``frame``, EOF, or None when the call moved to a per-call RPC."""
        if isinstance(frame, _Fallback):
            remaining = None if self._deadline is None else max(
                self._deadline - asyncio.get_running_loop().time(), 0.0)
            self._per_call = self._session.per_call(self._request, timeout=remaining)
            return grpc.aio.EOF if self._done else None
        if isinstance(frame, grpc.aio.AioRpcError):
            self._done = True
            raise frame
        if frame.WhichOneof("frame") == "response":
            self._done = self._done or frame.last
            return frame.response
        self._done = True
        if frame.end.code:
            raise _error(frame.end)
        return grpc.aio.EOF

    async def _responses(self) -> AsyncIterator[Any]:
        while (response := await self.read()) is not grpc.aio.EOF:
            yield response

    async def _reply(self) -> Any:
        response = await self.read()
        if response is grpc.aio.EOF:
            raise _status(grpc.StatusCode.INTERNAL, "the call ended without a reply")
        return response

    def _deliver(self, frame: Any) -> None:
        self._frames.put_nowait(frame)


class CallSession:
    """Calls of one method of one peer, multiplexed on one stream opened on first use."""

    def __init__(self, open_stream: Callable[[], Any], per_call: Callable[..., Any],
                 request_type: type, *, unary: bool = False) -> None:  # fmt: skip
        """``open_stream``: the stub's ``*Session`` method; ``per_call``: the stub's per-call
        method (used when the server has no session); ``request_type``: the session's request
        frame; ``unary``: the method answers with one response (awaited, not iterated)."""
        self._open_stream = open_stream
        self.per_call = per_call
        self._request_type = request_type
        self.unary = unary
        self._ids = itertools.count(1)
        self._calls: dict[int, SessionCall] = {}
        self._stream: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._opened: asyncio.Future[Any] | None = None
        self._write_lock = asyncio.Lock()
        self.supported = True

    def __call__(self, request: Any, *, timeout: float | None = None) -> Any:
        """Start a call of ``request`` (iterate it, or await it when unary)."""
        if not self.supported:
            return self.per_call(request, timeout=timeout)
        call = SessionCall(self, next(self._ids), request, timeout)
        self._calls[call.call_id] = call
        return call

    @property
    def num_open_calls(self) -> int:
        """Calls started and not yet ended (for tests and metrics)."""
        return len(self._calls)

    async def close(self) -> None:
        """Close the stream; calls in flight fail with CANCELLED."""
        stream, reader = self._stream, self._reader
        self._stream = self._reader = None
        if stream is not None:
            stream.cancel()
        if reader is not None:
            await asyncio.gather(reader, return_exceptions=True)
        self._fail_all(_status(grpc.StatusCode.CANCELLED, "the session was closed"))

    async def _write_request(self, call: SessionCall) -> None:
        if call.call_id not in self._calls:
            return  # NOTE: failed or fell back before its frame went out
        if not self.supported:
            call._deliver(_Fallback())
            return
        remaining = None if call._deadline is None else (
            call._deadline - asyncio.get_running_loop().time())
        timeout_ms = 0 if remaining is None else max(math.ceil(remaining * 1000), 1)
        await self._write(call, self._request_type(call_id=call.call_id, timeout_ms=timeout_ms,
                                                   request=call._request))  # fmt: skip

    def _cancel(self, call_id: int, *, sent: bool) -> None:
        if self._calls.pop(call_id, None) is not None and sent and self._stream is not None:
            frame = self._request_type(call_id=call_id, cancel=call_pb2.CallCancel())
            asyncio.ensure_future(self._write(None, frame))

    async def _write(self, call: SessionCall | None, frame: Any) -> None:
        if self._stream is None:
            self._stream = self._open_stream()
            # NOTE: the server answers a new session with its headers at once; until then a
            # write could race a refusal (UNIMPLEMENTED, UNAUTHENTICATED) and mask its status.
            self._opened = asyncio.ensure_future(self._stream.initial_metadata())
            self._reader = asyncio.ensure_future(self._read(self._stream))
        stream, reader, opened = self._stream, self._reader, self._opened
        try:
            if opened is not None:
                await opened
            if stream.done():
                raise asyncio.InvalidStateError("the session stream has ended")
            async with self._write_lock:
                await stream.write(frame)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            # NOTE: the stream ended; its reader settles every call it knew with the stream's
            # status (or moves them to per-call RPCs). A call it did not know fails here.
            if reader is not None:
                await asyncio.gather(reader, return_exceptions=True)
            if call is not None and self._calls.pop(call.call_id, None) is not None:
                call._deliver(_broken(e) if self.supported else _Fallback())

    async def _read(self, stream: Any) -> None:
        error: grpc.aio.AioRpcError
        try:
            while (frame := await stream.read()) is not grpc.aio.EOF:
                call = self._calls.get(frame.call_id)
                if call is None:
                    continue
                if frame.last or frame.WhichOneof("frame") == "end":
                    del self._calls[frame.call_id]
                call._deliver(frame)
            error = _status(grpc.StatusCode.UNAVAILABLE, "the server closed the session")
        except grpc.aio.AioRpcError as e:
            error = e
        except asyncio.CancelledError:
            return
        if self._stream is stream:
            self._stream = self._reader = None
        if error.code() == grpc.StatusCode.UNIMPLEMENTED:
            logger.info("peer has no session method; calling it per call from now on")
            self.supported = False
            calls, self._calls = self._calls, {}
            for call in calls.values():
                call._deliver(_Fallback())
            return
        self._fail_all(error)

    def _fail_all(self, error: grpc.aio.AioRpcError) -> None:
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call._deliver(error)


def _status(code: grpc.StatusCode, message: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), message)


def _error(end: Any) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata((STATUS_DETAILS_KEY, end.status_details)) if (
        end.status_details) else grpc.aio.Metadata()
    code = _CODES.get(end.code, grpc.StatusCode.UNKNOWN)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, end.message)


def _broken(error: Exception) -> grpc.aio.AioRpcError:
    if isinstance(error, grpc.aio.AioRpcError):
        return error
    return _status(grpc.StatusCode.UNAVAILABLE, f"the session broke: {error}")
