"""Prometheus metrics of the scheduler, read from its state at every scrape: the registry's
workers, the placements made, and what the adaptive policy has learned of each encoder."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from epd.common.metrics import (
    ScrapeCollector,
    counter,
    gauge,
    labelled_counter,
    labelled_gauge,
)
from epd.common.roles import Role
from epd.scheduler.core import Scheduler
from epd.scheduler.demand import EncoderDemand


def register_scheduler_metrics(scheduler: Scheduler, registry: CollectorRegistry) -> None:
    """Export ``scheduler``'s registry, assignments and learned encoder speeds."""
    registry.register(ScrapeCollector(lambda: _families(scheduler)))


def _families(scheduler: Scheduler) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    by_state: Counter[tuple[str, ...]] = Counter()
    for worker in scheduler.registry.all():
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
    yield from _demand_families(scheduler)
    yield from _held_families(scheduler)
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


def _held_families(scheduler: Scheduler) -> Iterator[GaugeMetricFamily]:
    """What the held-items index believes (``scheduler/holdings.py``)."""
    held, num_encoding = scheduler.held_counts()
    yield labelled_gauge(
        "epd_scheduler_held_items",
        "Items the scheduler believes each holder answers without a tower: an encoder's cache "
        '(its id) or the embedding store ("store"), from the encoders\' held-item reports',
        ["holder"],
        {(holder or "store",): n for holder, n in held.items()},
    )
    yield gauge(
        "epd_scheduler_items_encoding",
        "Items assigned to an encoder to encode and not reported yet (requests for one of them "
        "join its encoding)",
        num_encoding,
    )


# NOTE: one gauge per figure of scheduler/demand.py's EncoderDemand, labelled by its kind.
DEMAND_GAUGES: tuple[tuple[str, str, Callable[[EncoderDemand], float | None]], ...] = (
    (
        "epd_scheduler_encoders_needed",
        "Encoders of each kind the current arrivals need to keep the encode wait under "
        "--encode-wait-target-s (the autoscaling signal)",
        lambda d: d.num_needed,
    ),
    (
        "epd_scheduler_encoders_live",
        "Live encoders of each kind (registered, not draining)",
        lambda d: d.num_live,
    ),
    (
        "epd_scheduler_encode_arrivals_images_per_second",
        "Mean-sized images per second assigned to each kind and not answered from a cache, "
        "exponentially weighted over --demand-smoothing-s",
        lambda d: d.arrival_rate,
    ),
    (
        "epd_scheduler_encode_load_encoders",
        "Offered load: encoders of each kind kept busy on average (arrivals x learned cost)",
        lambda d: d.load,
    ),
    (
        "epd_scheduler_encode_image_cost_seconds",
        "Learned encoder-seconds of one mean-sized image on each kind (absent until measured)",
        lambda d: d.item_s,
    ),
)


def _demand_families(scheduler: Scheduler) -> Iterator[GaugeMetricFamily]:
    """The autoscaling signal (``scheduler/demand.py``), by model and device kind; a kind
    whose figure is None (not measured yet) is absent from that gauge."""
    demands = scheduler.encoder_demand()
    for name, documentation, figure in DEMAND_GAUGES:
        values = {(d.model, d.device): figure(d) for d in demands}
        yield labelled_gauge(
            name,
            documentation,
            ["model", "device"],
            {kind: value for kind, value in values.items() if value is not None},
        )
    yield gauge(
        "epd_scheduler_encode_wait_target_seconds",
        "The encode wait epd_scheduler_encoders_needed keeps under (--encode-wait-target-s)",
        scheduler.config.encode_wait_target_s,
    )
