"""Prometheus metrics of the route: requests by outcome, latencies, tokens, images, retries.

``RouteMetrics.observe(num_images)`` starts one request's observation; the route reports each
answer chunk to it and ends it with the error that ended the request (None: answered). The
time to first token runs from the request's arrival at the route to its first generated token;
the time per output token is the rest of the answer divided by the tokens after the first.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epd.common.errors import EpdError
from epd.common.metrics import COUNT_BUCKETS, LATENCY_BUCKETS_S, TOKEN_BUCKETS_S
from epd.server.media.loader import MediaLoader
from epd.server.media.metrics import register_media_metrics
from epd.server.transfer.metrics import register_plane_metrics
from epd.server.transfer.plane import DataPlane


class RouteMetrics:
    """The route's metrics, registered in ``registry``, with its media ``loader``'s and data
    ``plane``'s when given (the route always gives them; a test of its requests alone need not)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        loader: MediaLoader | None = None,
        plane: DataPlane | None = None,
    ) -> None:
        self._add_request_metrics(registry)
        self._add_routing_metrics(registry)
        if loader is not None:
            register_media_metrics(loader, registry)
        if plane is not None:
            register_plane_metrics(plane, registry)

    def _add_request_metrics(self, registry: CollectorRegistry) -> None:
        """Requests: outcomes, latencies, tokens and images."""
        self.requests = Counter(
            "epd_route_requests",
            "Generate requests ended, by outcome (ok, error, cancelled) and gRPC status code",
            ["outcome", "code"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "epd_route_requests_in_flight", "Generate requests being answered", registry=registry
        )
        self.time_to_first_token = Histogram(
            "epd_route_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first generated token",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.time_per_output_token = Histogram(
            "epd_route_time_per_output_token_seconds",
            "Mean seconds per generated token after the first, one sample per request",
            buckets=TOKEN_BUCKETS_S,
            registry=registry,
        )
        self.duration = Histogram(
            "epd_route_request_duration_seconds",
            "Seconds from a request's arrival to its end, whatever the outcome",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "epd_route_prompt_tokens",
            "Prompt tokens of answered requests, image placeholders included (engine's count)",
            registry=registry,
        )
        self.generated_tokens = Counter(
            "epd_route_generated_tokens", "Tokens generated and streamed back", registry=registry
        )
        self.images = Histogram(
            "epd_route_images_per_request",
            "Images in each request",
            buckets=COUNT_BUCKETS,
            registry=registry,
        )

    def _add_routing_metrics(self, registry: CollectorRegistry) -> None:
        """How requests were routed: encode retries, resumptions, the scheduler's absence."""
        self.encode_retries = Counter(
            "epd_route_encode_retries",
            "Images sent to another encoder after their encoder failed (UNAVAILABLE or died)",
            registry=registry,
        )
        self.resumptions = Counter(
            "epd_route_resumptions",
            "Streams moved to another replica after their worker failed mid-stream, by the "
            "failed worker's role (prefill: the worker that prefilled and streamed or handed KV "
            "over; decode: the decode worker)",
            ["role"],
            registry=registry,
        )
        self.scheduler_fallback = Gauge(
            "epd_route_scheduler_fallback",
            "1 while the scheduler is unreachable and the route routes from its own last view",
            registry=registry,
        )
        self.locally_routed = Counter(
            "epd_route_locally_routed",
            "Prefill workers the route chose from its own view while the scheduler was away",
            registry=registry,
        )

    def observe(self, num_images: int) -> RequestObservation:
        """Start observing a request with ``num_images`` images."""
        self.in_flight.inc()
        self.images.observe(num_images)
        return RequestObservation(self)


class RequestObservation:
    """One request's timings and counts, recorded in its ``RouteMetrics`` by ``end``."""

    def __init__(self, metrics: RouteMetrics) -> None:
        self._metrics = metrics
        self._start = time.monotonic()
        self._first_token_at: float | None = None
        self._num_tokens = 0
        self._num_prompt_tokens = 0

    def add(self, num_tokens: int, num_prompt_tokens: int = 0) -> None:
        """A chunk of the answer: ``num_tokens`` generated, and the engine's prompt count
        when the chunk carries usage."""
        if num_tokens and self._first_token_at is None:
            self._first_token_at = time.monotonic()
            self._metrics.time_to_first_token.observe(self._first_token_at - self._start)
        self._num_tokens += num_tokens
        self._num_prompt_tokens = num_prompt_tokens or self._num_prompt_tokens

    def end(self, error: BaseException | None) -> None:
        """The request ended with ``error`` (None: answered in full)."""
        metrics, now = self._metrics, time.monotonic()
        metrics.in_flight.dec()
        metrics.duration.observe(now - self._start)
        metrics.generated_tokens.inc(self._num_tokens)
        metrics.prompt_tokens.inc(self._num_prompt_tokens)
        if self._first_token_at is not None and self._num_tokens > 1:
            seconds = (now - self._first_token_at) / (self._num_tokens - 1)
            metrics.time_per_output_token.observe(seconds)
        metrics.requests.labels(*_outcome(error)).inc()


def _outcome(error: BaseException | None) -> tuple[str, str]:
    if error is None:
        return "ok", "OK"
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return "cancelled", "CANCELLED"
    if isinstance(error, EpdError):
        code = error.code.value
        return ("cancelled" if code == "CANCELLED" else "error"), code
    return "error", "INTERNAL"
