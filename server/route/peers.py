"""Channels to the other services, one per endpoint, reused across requests."""

from __future__ import annotations

import grpc

from epd.server.common.channels import ChannelPool
from epd.server.common.tasks import BackgroundCalls
from epd.v1 import (
    decode_service_pb2_grpc,
    encode_service_pb2_grpc,
    prefill_service_pb2_grpc,
    scheduler_service_pb2_grpc,
)


class Peers:
    """Lazily opened channels keyed by endpoint, with typed stubs."""

    def __init__(self, scheduler_endpoint: str, auth_token: str | None = None) -> None:
        self._channels = ChannelPool(auth_token)
        self.background = BackgroundCalls()
        self.scheduler = scheduler_service_pb2_grpc.SchedulerServiceStub(
            self._channel(scheduler_endpoint))

    def encoder(self, endpoint: str) -> encode_service_pb2_grpc.EncodeServiceStub:
        """Stub of the encoder at ``endpoint``."""
        return encode_service_pb2_grpc.EncodeServiceStub(self._channel(endpoint))

    def prefill(self, endpoint: str) -> prefill_service_pb2_grpc.PrefillServiceStub:
        """Stub of the prefill worker at ``endpoint``."""
        return prefill_service_pb2_grpc.PrefillServiceStub(self._channel(endpoint))

    def decode(self, endpoint: str) -> decode_service_pb2_grpc.DecodeServiceStub:
        """Stub of the decode worker at ``endpoint``."""
        return decode_service_pb2_grpc.DecodeServiceStub(self._channel(endpoint))

    async def close(self) -> None:
        """Wait for background calls, then close every channel."""
        await self.background.settle()
        await self._channels.close()

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        return self._channels.get(endpoint)
