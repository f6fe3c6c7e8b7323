"""Clients of the services the route calls on every request: the scheduler, the encoders, the
prefill and decode workers. Each wraps one peer's long-lived channel, on which gRPC multiplexes
every call, and is the route's one RPC-error boundary: a failed call raises the ``EpdError`` of
its status (``status.from_rpc_error``: code, reason and metadata as the peer sent them; a worker
that cannot be reached is Unavailable, reason PEER_UNREACHABLE, naming its endpoint), never
``grpc.aio.AioRpcError``. Methods are named after the RPCs they call."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd.common.status import from_rpc_error
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc

Response = TypeVar("Response")


class Responses(Generic[Response]):
    """The responses of one server-streaming call, in order (``async for``); iterating again goes
    on where the last iteration stopped. A failure raises the call's ``EpdError``."""

    def __init__(self, call: Any, peer: str) -> None:
        self._call = call
        self._peer = peer

    def __aiter__(self) -> Responses[Response]:
        return self

    async def __anext__(self) -> Response:
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, self._peer) from None
        if response is grpc.aio.EOF:
            raise StopAsyncIteration
        result: Response = response
        return result

    def cancel(self) -> bool:
        """End the call (the server's handler is cancelled); False once it has ended."""
        return bool(self._call.cancel())


async def _answer(call: Awaitable[Any], peer: str) -> Any:
    try:
        return await call
    except grpc.aio.AioRpcError as e:
        raise from_rpc_error(e, peer) from None


class SchedulerClient:
    """The scheduler's calls the route makes. Failures keep the scheduler's reasons (one that
    cannot be reached is Unavailable, reason UNAVAILABLE)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = scheduler_grpc.SchedulerServiceStub(channel)

    async def ListWorkers(
        self, request: scheduler_pb.ListWorkersRequest, *, timeout: float | None = None
    ) -> scheduler_pb.ListWorkersResponse:
        reply: scheduler_pb.ListWorkersResponse = await _answer(
            self._stub.ListWorkers(request, timeout=timeout), ""
        )
        return reply

    async def AssignEncoders(
        self,
        request: scheduler_pb.AssignEncodersRequest,
        *,
        timeout: float | None = None,
    ) -> scheduler_pb.AssignEncodersResponse:
        reply: scheduler_pb.AssignEncodersResponse = await _answer(
            self._stub.AssignEncoders(request, timeout=timeout), ""
        )
        return reply

    async def CompleteEncoding(
        self,
        request: scheduler_pb.CompleteEncodingRequest,
        *,
        timeout: float | None = None,
    ) -> scheduler_pb.CompleteEncodingResponse:
        reply: scheduler_pb.CompleteEncodingResponse = await _answer(
            self._stub.CompleteEncoding(request, timeout=timeout), ""
        )
        return reply

    async def ChoosePrefill(
        self,
        request: scheduler_pb.ChoosePrefillRequest,
        *,
        timeout: float | None = None,
    ) -> scheduler_pb.ChoosePrefillResponse:
        reply: scheduler_pb.ChoosePrefillResponse = await _answer(
            self._stub.ChoosePrefill(request, timeout=timeout), ""
        )
        return reply

    async def ChooseDecode(
        self, request: scheduler_pb.ChooseDecodeRequest, *, timeout: float | None = None
    ) -> scheduler_pb.ChooseDecodeResponse:
        reply: scheduler_pb.ChooseDecodeResponse = await _answer(
            self._stub.ChooseDecode(request, timeout=timeout), ""
        )
        return reply

    async def Place(
        self, request: scheduler_pb.PlaceRequest, *, timeout: float | None = None
    ) -> scheduler_pb.PlaceResponse:
        reply: scheduler_pb.PlaceResponse = await _answer(
            self._stub.Place(request, timeout=timeout), ""
        )
        return reply


class EncoderClient:
    """``Encode`` and ``Release`` of the encoder at ``endpoint``."""

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        self._stub = encode_grpc.EncodeServiceStub(channel)
        self.endpoint = endpoint

    def Encode(
        self, request: encode_pb.EncodeRequest, *, timeout: float | None = None
    ) -> Responses[encode_pb.EncodeResponse]:
        return Responses(self._stub.Encode(request, timeout=timeout), self.endpoint)

    async def Release(
        self, request: encode_pb.ReleaseRequest, *, timeout: float | None = None
    ) -> encode_pb.ReleaseResponse:
        reply: encode_pb.ReleaseResponse = await _answer(
            self._stub.Release(request, timeout=timeout), self.endpoint
        )
        return reply


class PrefillClient:
    """``Prefill`` and ``PrefillDecode`` of the prefill worker at ``endpoint``."""

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        self._stub = prefill_grpc.PrefillServiceStub(channel)
        self.endpoint = endpoint

    async def Prefill(
        self, request: prefill_pb.PrefillRequest, *, timeout: float | None = None
    ) -> prefill_pb.PrefillResponse:
        reply: prefill_pb.PrefillResponse = await _answer(
            self._stub.Prefill(request, timeout=timeout), self.endpoint
        )
        return reply

    def PrefillDecode(
        self, request: prefill_pb.PrefillDecodeRequest, *, timeout: float | None = None
    ) -> Responses[prefill_pb.PrefillDecodeResponse]:
        return Responses(self._stub.PrefillDecode(request, timeout=timeout), self.endpoint)


class DecodeClient:
    """``Decode`` of the decode worker at ``endpoint``."""

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        self._stub = decode_grpc.DecodeServiceStub(channel)
        self.endpoint = endpoint

    def Decode(
        self, request: decode_pb.DecodeRequest, *, timeout: float | None = None
    ) -> Responses[decode_pb.DecodeResponse]:
        return Responses(self._stub.Decode(request, timeout=timeout), self.endpoint)


class HealthClient:
    """``grpc.health.v1`` Check of the server at ``endpoint`` (its overall status)."""

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self.endpoint = endpoint

    async def is_serving(self, *, timeout: float | None = None) -> bool:
        """Whether the server answers SERVING; False when it answers anything else (a draining
        server: NOT_SERVING) or cannot be reached. Never raises."""
        try:
            reply = await self._stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
