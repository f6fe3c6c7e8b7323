"""Clients of the services a process calls on every request: the encoder, prefill and decode
workers. Their hot methods go through call sessions (``session_client``): one long-lived stream
per peer and method instead of a new RPC per call.

Sessions are used unless the process traces RPCs (``telemetry.traces_rpcs``: a per-call RPC gets
its own span and carries the trace context) or ``EPD_CALL_SESSIONS=0`` is set. Either way the
methods look alike to callers: ``client.Encode(request, timeout=...)``.
"""

from __future__ import annotations

import os
from typing import Any

import grpc

from epd.server.common.session_client import CallSession
from epd.server.common.telemetry import traces_rpcs
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc

SESSIONS_ENV = "EPD_CALL_SESSIONS"


def sessions_enabled() -> bool:
    """Whether calls go through sessions in this process (see the module docstring)."""
    return os.environ.get(SESSIONS_ENV, "1") != "0" and not traces_rpcs()


class _Client:
    def __init__(self, sessions: bool | None) -> None:
        self.uses_sessions = sessions_enabled() if sessions is None else sessions
        self._sessions: list[CallSession] = []

    def _method(self, stub: Any, name: str, frame_type: type, *, unary: bool = False) -> Any:
        per_call = getattr(stub, name)
        if not self.uses_sessions:
            return per_call
        session = CallSession(getattr(stub, f"{name}Session"), per_call, frame_type, unary=unary)
        self._sessions.append(session)
        return session

    async def close(self) -> None:
        """Close the sessions (calls in flight fail with CANCELLED); the channel stays open."""
        for session in self._sessions:
            await session.close()


class EncoderClient(_Client):
    """``Encode`` (through a session) and ``Release`` of one encoder."""

    def __init__(self, channel: grpc.aio.Channel, *, sessions: bool | None = None) -> None:
        super().__init__(sessions)
        stub = encode_grpc.EncodeServiceStub(channel)
        self.Encode = self._method(stub, "Encode", encode_pb.EncodeSessionRequest)
        self.Release = stub.Release


class PrefillClient(_Client):
    """``Prefill`` and ``PrefillDecode`` of one prefill worker (both through sessions)."""

    def __init__(self, channel: grpc.aio.Channel, *, sessions: bool | None = None) -> None:
        super().__init__(sessions)
        stub = prefill_grpc.PrefillServiceStub(channel)
        self.Prefill = self._method(stub, "Prefill", prefill_pb.PrefillSessionRequest, unary=True)
        self.PrefillDecode = self._method(stub, "PrefillDecode",
                                          prefill_pb.PrefillDecodeSessionRequest)  # fmt: skip


class DecodeClient(_Client):
    """``Decode`` of one decode worker (through a session)."""

    def __init__(self, channel: grpc.aio.Channel, *, sessions: bool | None = None) -> None:
        super().__init__(sessions)
        stub = decode_grpc.DecodeServiceStub(channel)
        self.Decode = self._method(stub, "Decode", decode_pb.DecodeSessionRequest)
