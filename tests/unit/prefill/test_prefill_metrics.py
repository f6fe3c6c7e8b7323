"""A prefill worker's metrics: its own, with its media loader's and data plane's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.metrics import PrefillMetrics
from epd.server.transfer.plane import DataPlane
from tests.scrape import value


def test_the_workers_loader_and_plane_are_exported_with_its_own_metrics() -> None:
    registry = CollectorRegistry()
    loader = MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    loader.num_refused["IMAGE_TOO_LARGE"] += 2
    plane = DataPlane(kinds=("shm",))
    try:
        PrefillMetrics(registry, loader, plane).embedding_handoff.observe(0.5)
        text = generate_latest(registry).decode()
    finally:
        plane.close()
    exported = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert value(exported, "epd_media_refusals_total", reason="IMAGE_TOO_LARGE") == 2
    assert value(exported, "epd_transfer_leases_outstanding", kind="shm") == 0
    assert value(exported, "epd_prefill_embedding_handoff_seconds_count") == 1
