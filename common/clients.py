"""Clients of the services the route calls on every request: the scheduler, the encoders, the
prefill and decode workers. Each wraps one peer's long-lived channel, on which gRPC multiplexes
every call, and is the route's one RPC-error boundary: a failed call raises the ``EpdError`` of
its status (``status.from_rpc_error``: code, reason and metadata as the peer sent them; a worker
that cannot be reached is Unavailable, reason PEER_UNREACHABLE, naming its endpoint), never
``grpc.aio.AioRpcError``. Each RPC is an attribute named after it (``UnaryRpc`` or
``StreamingRpc`` over the stub's method), called as the stub's method is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
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

Request = TypeVar("Request")
Response = TypeVar("Response")


@dataclass(frozen=True, slots=True)
class Responses(Generic[Response]):
    """The responses of one server-streaming call, in order (``async for``); iterating again goes
    on where the last iteration stopped. A failure raises the call's ``EpdError``."""

    call: grpc.aio.UnaryStreamCall[Any, Response]
    peer: str

    async def __aiter__(self) -> AsyncIterator[Response]:
        # NOTE: the call hands every iteration the same iterator, so a new one reads on.
        try:
            async for response in self.call:
                yield response
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, self.peer) from None

    def cancel(self) -> bool:
        """End the call (the server's handler is cancelled); False once it has ended."""
        return bool(self.call.cancel())


@dataclass(frozen=True, slots=True)
class UnaryRpc(Generic[Request, Response]):
    """One unary RPC of ``peer`` (the stub's ``method``): its answer, or its ``EpdError``."""

    method: grpc.aio.UnaryUnaryMultiCallable[Request, Response]
    peer: str = ""

    async def __call__(self, request: Request, *, timeout: float | None = None) -> Response:
        try:
            reply: Response = await self.method(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, self.peer) from None
        return reply


@dataclass(frozen=True, slots=True)
class StreamingRpc(Generic[Request, Response]):
    """One server-streaming RPC of ``peer`` (the stub's ``method``): its ``Responses``."""

    method: grpc.aio.UnaryStreamMultiCallable[Request, Response]
    peer: str

    def __call__(self, request: Request, *, timeout: float | None = None) -> Responses[Response]:
        return Responses(self.method(request, timeout=timeout), self.peer)


class SchedulerClient:
    """The scheduler's calls the route makes. Failures keep the scheduler's reasons (one that
    cannot be reached is Unavailable, reason UNAVAILABLE)."""

    ListWorkers: UnaryRpc[scheduler_pb.ListWorkersRequest, scheduler_pb.ListWorkersResponse]
    AssignEncoders: UnaryRpc[
        scheduler_pb.AssignEncodersRequest, scheduler_pb.AssignEncodersResponse
    ]
    CompleteEncoding: UnaryRpc[
        scheduler_pb.CompleteEncodingRequest, scheduler_pb.CompleteEncodingResponse
    ]
    ChoosePrefill: UnaryRpc[scheduler_pb.ChoosePrefillRequest, scheduler_pb.ChoosePrefillResponse]
    ChooseDecode: UnaryRpc[scheduler_pb.ChooseDecodeRequest, scheduler_pb.ChooseDecodeResponse]
    Place: UnaryRpc[scheduler_pb.PlaceRequest, scheduler_pb.PlaceResponse]

    def __init__(self, channel: grpc.aio.Channel) -> None:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        self.ListWorkers = UnaryRpc(stub.ListWorkers)
        self.AssignEncoders = UnaryRpc(stub.AssignEncoders)
        self.CompleteEncoding = UnaryRpc(stub.CompleteEncoding)
        self.ChoosePrefill = UnaryRpc(stub.ChoosePrefill)
        self.ChooseDecode = UnaryRpc(stub.ChooseDecode)
        self.Place = UnaryRpc(stub.Place)


class EncoderClient:
    """``Encode`` and ``Release`` of the encoder at ``endpoint``."""

    Encode: StreamingRpc[encode_pb.EncodeRequest, encode_pb.EncodeResponse]
    Release: UnaryRpc[encode_pb.ReleaseRequest, encode_pb.ReleaseResponse]

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        stub = encode_grpc.EncodeServiceStub(channel)
        self.endpoint = endpoint
        self.Encode = StreamingRpc(stub.Encode, endpoint)
        self.Release = UnaryRpc(stub.Release, endpoint)


class PrefillClient:
    """``Prefill`` and ``PrefillDecode`` of the prefill worker at ``endpoint``."""

    Prefill: UnaryRpc[prefill_pb.PrefillRequest, prefill_pb.PrefillResponse]
    PrefillDecode: StreamingRpc[prefill_pb.PrefillDecodeRequest, prefill_pb.PrefillDecodeResponse]

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        stub = prefill_grpc.PrefillServiceStub(channel)
        self.endpoint = endpoint
        self.Prefill = UnaryRpc(stub.Prefill, endpoint)
        self.PrefillDecode = StreamingRpc(stub.PrefillDecode, endpoint)


class DecodeClient:
    """``Decode`` of the decode worker at ``endpoint``."""

    Decode: StreamingRpc[decode_pb.DecodeRequest, decode_pb.DecodeResponse]

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        self.endpoint = endpoint
        self.Decode = StreamingRpc(decode_grpc.DecodeServiceStub(channel).Decode, endpoint)


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
