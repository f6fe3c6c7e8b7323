"""The route's and a prefill worker's metrics export their process's media loader and data plane
beside their own (an encoder's: tests/grpc/encode/test_encode_metrics.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.metrics import PrefillMetrics
from epd.server.route.metrics import RouteMetrics
from epd.server.transfer.plane import DataPlane
from tests.scrape import value

OWN_SERIES = {
    "route": "epd_route_requests_in_flight",
    "prefill": "epd_prefill_embedding_handoff_seconds_count",
}
METRICS: dict[str, Callable[[CollectorRegistry, MediaLoader, DataPlane], Any]] = {
    "route": lambda registry, loader, plane: RouteMetrics(registry, loader=loader, plane=plane),
    "prefill": PrefillMetrics,
}


@pytest.mark.parametrize("process", sorted(METRICS))
def test_the_loader_and_plane_are_exported_with_the_process_metrics(process: str) -> None:
    registry = CollectorRegistry()
    loader = MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    loader.num_refused["BAD_IMAGE"] += 2
    plane = DataPlane(kinds=("shm",))
    try:
        METRICS[process](registry, loader, plane)
        text = generate_latest(registry).decode()
    finally:
        plane.close()
    exported = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert value(exported, "epd_media_refusals_total", reason="BAD_IMAGE") == 2
    assert value(exported, "epd_transfer_leases_outstanding", kind="shm") == 0
    assert value(exported, OWN_SERIES[process]) == 0
