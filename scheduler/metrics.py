"""Prometheus metrics of the scheduler, read from its state at every scrape: the registry's
workers, the placements made, and what the adaptive policy has learned of each encoder."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from epd.common.metrics import ScrapeCollector, counter, labelled_counter, labelled_gauge
from epd.common.roles import Role
from epd.scheduler.core import Scheduler


def register_scheduler_metrics(scheduler: Scheduler, registry: CollectorRegistry) -> None:
    """Export ``scheduler``'s registry, assignments and learned encoder speeds."""
    registry.register(ScrapeCollector(lambda: _families(scheduler)))


def _families(scheduler: Scheduler) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    by_state: Counter[tuple[str, ...]] = Counter()
    for worker in scheduler.list_workers():
        by_state[worker.spec.role.label, "draining" if worker.draining else "live"] += 1
    every_state: dict[tuple[str, ...], float] = {
        (role.label, state): 0 for role in Role for state in ("live", "draining")
    }
    yield labelled_gauge(
        "epd_scheduler_workers",
        "Registered workers by role and state (live: chosen for work; draining: deregistered, "
        "finishing assigned work)",
        ["role", "state"],
        {**every_state, **by_state},
    )
    registry = scheduler.registry
    yield labelled_counter(
        "epd_scheduler_registrations",
        "Worker registrations accepted (re-registrations included), by role",
        ["role"],
        {(role.label,): registry.num_registered[role] for role in Role},
    )
    yield counter(
        "epd_scheduler_evictions",
        "Workers removed because their heartbeats stopped for longer than the TTL",
        registry.num_evicted,
    )
    yield labelled_counter(
        "epd_scheduler_assigned_items",
        "Images placed on encoders, by assignment policy and encoder id (an encoder's series go "
        "when it leaves the registry)",
        ["policy", "encoder"],
        {(policy.value, encoder): n for (policy, encoder), n in scheduler.num_assigned.items()},
    )
    views = scheduler.encoder_views()
    yield labelled_gauge(
        "epd_scheduler_encoder_service_seconds",
        "Learned time one mean-sized image takes on each encoder (the adaptive policy's speed "
        "estimate; absent until measured)",
        ["encoder"],
        {(v.id,): v.service_ms / 1000 for v in views if v.service_ms is not None},
    )
    yield labelled_gauge(
        "epd_scheduler_encoder_backlog_images",
        "Images assigned to each encoder and not yet reported done",
        ["encoder"],
        {(v.id,): v.backlog_items for v in views},
    )
    yield labelled_gauge(
        "epd_scheduler_encoder_backlog_seconds",
        "Expected seconds until each encoder finishes the work assigned to it (adaptive)",
        ["encoder"],
        {(v.id,): (v.backlog_ms or 0.0) / 1000 for v in views},
    )
