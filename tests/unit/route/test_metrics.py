"""The route's request observation: outcomes by status code, first-token and per-token times,
tokens and images, requests in flight."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.common.errors import Unavailable
from epd.server.route.metrics import RouteMetrics
from tests.scrape import value


def samples(registry: CollectorRegistry) -> list:
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_requests_are_counted_by_outcome_and_timed() -> None:
    registry = CollectorRegistry()
    metrics = RouteMetrics(registry)
    answered = metrics.observe(num_images=2)
    failed = metrics.observe(num_images=0)
    cancelled = metrics.observe(num_images=1)
    running = samples(registry)
    answered.add(0)
    time.sleep(0.01)
    answered.add(1)
    time.sleep(0.02)
    answered.add(2, num_prompt_tokens=40)
    answered.end(None)
    failed.end(Unavailable("no encoder", reason="NO_ENCODER"))
    cancelled.add(1)
    cancelled.end(asyncio.CancelledError())
    ended = samples(registry)

    assert value(running, "epd_route_requests_in_flight") == 3
    assert value(ended, "epd_route_requests_in_flight") == 0
    assert value(ended, "epd_route_requests_total", outcome="ok", code="OK") == 1
    assert value(ended, "epd_route_requests_total", outcome="error", code="UNAVAILABLE") == 1
    assert value(ended, "epd_route_requests_total", outcome="cancelled", code="CANCELLED") == 1
    assert value(ended, "epd_route_generated_tokens_total") == 4
    assert value(ended, "epd_route_prompt_tokens_total") == 40
    assert value(ended, "epd_route_images_per_request_sum") == 3
    assert value(ended, "epd_route_time_to_first_token_seconds_count") == 2
    assert value(ended, "epd_route_time_to_first_token_seconds_sum") >= 0.01
    # NOTE: one sample, from the answered request: 2 tokens after its first, >= 20 ms apart
    assert value(ended, "epd_route_time_per_output_token_seconds_count") == 1
    assert value(ended, "epd_route_time_per_output_token_seconds_sum") >= 0.01
    assert value(ended, "epd_route_request_duration_seconds_count") == 3
