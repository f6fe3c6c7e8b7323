"""Clients of the other services, one per endpoint over one channel, reused across requests.
They raise domain errors (``clients``): the route's logic never sees a gRPC error."""

from __future__ import annotations

from epd.common.channels import DEFAULT_KEEPALIVE_S, ChannelPool
from epd.common.clients import DecodeClient, EncoderClient, PrefillClient, SchedulerClient
from epd.common.tasks import BackgroundCalls


class Peers:
    """Lazily opened channels keyed by endpoint, with their clients."""

    def __init__(
        self,
        scheduler_endpoint: str,
        auth_token: str | None = None,
        *,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
    ) -> None:
        self._channels = ChannelPool(auth_token, keepalive_s=keepalive_s)
        self.background = BackgroundCalls()
        self.scheduler = SchedulerClient(self._channels.get(scheduler_endpoint))

    def encoder(self, endpoint: str) -> EncoderClient:
        """Client of the encoder at ``endpoint``."""
        return self._channels.client(endpoint, EncoderClient)

    def prefill(self, endpoint: str) -> PrefillClient:
        """Client of the prefill worker at ``endpoint``."""
        return self._channels.client(endpoint, PrefillClient)

    def decode(self, endpoint: str) -> DecodeClient:
        """Client of the decode worker at ``endpoint``."""
        return self._channels.client(endpoint, DecodeClient)

    async def close(self) -> None:
        """Wait for background calls, then close every channel."""
        await self.background.settle()
        await self._channels.close()
