"""Clients of the other services, one per endpoint over one channel, reused across requests.
They raise domain errors (``clients``): the route's logic never sees a gRPC error. The
scheduler's client keeps the workers' listing fresh in the background (its ``watch``), the one
source of the route's view of the live roles (``roles``)."""

from __future__ import annotations

import asyncio
import contextlib

from epd.common.channels import DEFAULT_KEEPALIVE_S, ChannelPool
from epd.common.clients import (
    DecodeClient,
    EncoderClient,
    HealthClient,
    PrefillClient,
    SchedulerClient,
)
from epd.common.tasks import BackgroundCalls
from epd.server.route.metrics import RouteMetrics
from epd.server.route.scheduler_fallback import (
    DEFAULT_FALLBACK_S,
    HEALTH_TIMEOUT_S,
    FallbackScheduler,
)
from epd.server.route.topology import RoleView


class Peers:
    """Lazily opened channels keyed by endpoint, with their clients. ``scheduler`` answers from
    its last listing while the scheduler is unreachable, for up to ``scheduler_fallback_s``
    (``scheduler_fallback``); ``roles``: the live roles of its listings (``start``)."""

    def __init__(
        self,
        scheduler_endpoint: str,
        auth_token: str | None = None,
        *,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        scheduler_fallback_s: float = DEFAULT_FALLBACK_S,
        metrics: RouteMetrics | None = None,
    ) -> None:
        self._channels = ChannelPool(auth_token, keepalive_s=keepalive_s)
        self.background = BackgroundCalls()
        self.roles = RoleView()
        self.scheduler = FallbackScheduler(
            SchedulerClient(self._channels.get(scheduler_endpoint)),
            self.is_serving,
            scheduler_fallback_s,
            metrics=metrics,
            on_listing=self.roles.update,
        )
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Keep the scheduler's listing, and so ``roles``, fresh in the background."""
        if self._watch is None:
            self._watch = asyncio.create_task(self.scheduler.watch())

    def encoder(self, endpoint: str) -> EncoderClient:
        """Client of the encoder at ``endpoint``."""
        return self._channels.client(endpoint, EncoderClient)

    def prefill(self, endpoint: str) -> PrefillClient:
        """Client of the prefill worker at ``endpoint``."""
        return self._channels.client(endpoint, PrefillClient)

    def decode(self, endpoint: str) -> DecodeClient:
        """Client of the decode worker at ``endpoint``."""
        return self._channels.client(endpoint, DecodeClient)

    async def is_serving(self, endpoint: str) -> bool:
        """Whether the worker at ``endpoint`` answers its health check SERVING."""
        client = self._channels.client(endpoint, HealthClient)
        return await client.is_serving(timeout=HEALTH_TIMEOUT_S)

    async def close(self) -> None:
        """Stop the listing's refresh, wait for background calls, then close every channel."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        await self.background.settle()
        await self._channels.close()
