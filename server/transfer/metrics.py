"""Prometheus metrics of a process's data plane, read from the plane at every scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from epd.common.metrics import ScrapeCollector, gauge, labelled_counter, labelled_gauge
from epd.server.transfer import nixl_agent
from epd.server.transfer.plane import DataPlane


def register_plane_metrics(plane: DataPlane, registry: CollectorRegistry) -> None:
    """Export ``plane``'s leases, bytes moved, segments and NIXL regions into ``registry``."""
    registry.register(ScrapeCollector(lambda: _families(plane)))


def _families(plane: DataPlane) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    num_leases: Counter[str] = Counter()
    num_bytes: Counter[str] = Counter()
    for info in plane.held():
        num_leases[info.kind] += 1
        num_bytes[info.kind] += info.byte_size
    kinds = [producer.kind for producer in plane.producers.values()]
    yield labelled_gauge(
        "epd_transfer_leases_outstanding",
        "Payloads this process produced and holds until their consumer releases them or the "
        "lease expires",
        ["kind"],
        {(kind,): num_leases[kind] for kind in kinds},
    )
    yield labelled_gauge(
        "epd_transfer_leased_bytes",
        "Bytes of the payloads in epd_transfer_leases_outstanding",
        ["kind"],
        {(kind,): num_bytes[kind] for kind in kinds},
    )
    moved: dict[tuple[str, ...], float] = {(kind, "put"): 0 for kind in kinds}
    moved.update(plane.bytes_moved().items())
    yield labelled_counter(
        "epd_transfer_bytes",
        "Bytes handed over through the data plane: put by this process as producer, read by "
        "it as consumer",
        ["kind", "direction"],
        moved,
    )
    expired = plane.leases_expired()
    yield labelled_counter(
        "epd_transfer_leases_expired",
        "Leases freed by the reaper because nobody released them before they expired (a leak "
        "signal: a consumer died or forgot to release)",
        ["kind"],
        {(kind,): expired.get(kind, 0) for kind in kinds},
    )
    yield gauge(
        "epd_transfer_shm_segments",
        "Shared-memory segments this process owns now (leased or pooled for reuse)",
        plane.num_shm_segments(),
    )
    yield gauge(
        "epd_transfer_nixl_registered_regions",
        "Memory regions this process has registered with NIXL now",
        nixl_agent.num_registered_regions(),
    )
