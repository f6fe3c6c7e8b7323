"""The scheduler's metrics read its state: workers by role and state, registrations, evictions,
placements by policy and encoder, and the adaptive policy's learned speeds and backlogs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.common.held_items import HeldReport
from epd.common.roles import Role
from epd.scheduler.metrics import register_scheduler_metrics
from epd.scheduler.model import EncodeItem, ItemOutcome, Policy
from tests.scrape import value
from tests.unit.scheduler.factories import create_scheduler, spec


def samples(registry: CollectorRegistry) -> list:
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_metrics_follow_the_scheduler() -> None:
    scheduler, clock = create_scheduler(
        spec("cpu"), spec("gpu", device="cuda:0"), spec("p", Role.PREFILL_DECODE), ttl_s=5
    )
    registry = CollectorRegistry()
    register_scheduler_metrics(scheduler, registry)
    items = [EncodeItem(f"h{i}") for i in range(3)]
    first = scheduler.assign_encoders(items, policy=Policy.PER_REQUEST)
    second = scheduler.assign_encoders(items[:1], policy=Policy.ADAPTIVE, exclude=first.worker_ids)
    busy = samples(registry)
    scheduler.heartbeat(scheduler.registry.get("gpu").lease_id, held=HeldReport(stored=("s",)))  # type: ignore[union-attr]
    outcomes = [ItemOutcome(i, 40.0) for i in range(3)]
    scheduler.complete_encoding(first.assignment_id, outcomes)
    scheduler.complete_encoding(second.assignment_id, outcomes[:1])
    (encoder,), (other,) = set(first.worker_ids), set(second.worker_ids)
    learned = samples(registry)
    clock.now += 4
    for worker_id in (encoder, "p"):
        scheduler.heartbeat(scheduler.registry.get(worker_id).lease_id)  # type: ignore[union-attr]
    clock.now += 2
    evicted = samples(registry)

    assert value(busy, "epd_scheduler_workers", role="encode", state="live") == 2
    assert value(busy, "epd_scheduler_workers", role="prefill_decode", state="live") == 1
    assert value(busy, "epd_scheduler_workers", role="decode", state="live") == 0
    assert value(busy, "epd_scheduler_registrations_total", role="encode") == 2
    per_request = value(
        busy, "epd_scheduler_assigned_items_total", policy="per_request", encoder=encoder
    )
    assert per_request == 3
    assert value(busy, "epd_scheduler_assigned_items_total", policy="adaptive", encoder=other) == 1
    assert value(busy, "epd_scheduler_encoder_backlog_images", encoder=encoder) == 3
    assert value(busy, "epd_scheduler_items_encoding") == 3  # h0 on both encoders: one item
    assert value(learned, "epd_scheduler_items_encoding") == 0
    assert value(learned, "epd_scheduler_held_items", holder=encoder) == 3
    assert value(learned, "epd_scheduler_held_items", holder="store") == 1
    assert value(busy, "epd_scheduler_encoder_backlog_seconds", encoder=encoder) >= 0
    assert value(learned, "epd_scheduler_encoder_backlog_images", encoder=encoder) == 0
    for worker_id in (encoder, other):
        assert value(learned, "epd_scheduler_encoder_service_seconds", encoder=worker_id) > 0
    assert value(learned, "epd_scheduler_evictions_total") == 0
    assert value(evicted, "epd_scheduler_evictions_total") == 1
    assert value(evicted, "epd_scheduler_workers", role="encode", state="live") == 1
    assert value(evicted, "epd_scheduler_assigned_items_total", encoder=encoder) == 3
    assert not [
        s
        for s in evicted
        if s.name == "epd_scheduler_assigned_items_total" and s.labels["encoder"] == other
    ], "an evicted encoder's placement series is dropped with it"


def test_an_unmeasured_image_cost_is_absent_beside_the_kinds_other_figures() -> None:
    scheduler, _ = create_scheduler(spec("e0"), ttl_s=1000)
    registry = CollectorRegistry()
    register_scheduler_metrics(scheduler, registry)
    [demand] = scheduler.encoder_demand()
    scraped = samples(registry)
    labels = {"model": demand.model, "device": "cpu"}
    assert demand.item_s is None
    assert value(scraped, "epd_scheduler_encoders_live", **labels) == 1
    assert value(scraped, "epd_scheduler_encoders_needed", **labels) == demand.num_needed
    assert not [s for s in scraped if s.name == "epd_scheduler_encode_image_cost_seconds"]
