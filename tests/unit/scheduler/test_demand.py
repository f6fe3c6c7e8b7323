"""The autoscaling signal: the rule (Erlang C wait under the target, backlog cleared within it),
the smoothed arrivals, and the scheduler's figure per model and kind from what it measured."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.scheduler.demand import (
    DecayingRate,
    DemandTracker,
    KindState,
    device_kind,
    encoders_needed,
    erlang_c_wait_s,
)
from epd.scheduler.metrics import register_scheduler_metrics
from epd.scheduler.model import EncodeItem, ItemOutcome
from tests.scrape import value
from tests.unit.scheduler.factories import create_scheduler, spec


def test_erlang_c_matches_the_closed_forms() -> None:
    # M/M/1: W = rho S / (1 - rho); M/M/2 with A = 1: C = 1/3, W = C S / (2 - A)
    assert erlang_c_wait_s(1, 0.5, 0.1) == pytest.approx(0.5 * 0.1 / 0.5)
    assert erlang_c_wait_s(2, 1.0, 0.1) == pytest.approx(0.1 / 3)
    assert erlang_c_wait_s(2, 2.0, 0.1) == math.inf
    assert erlang_c_wait_s(3, 0.0, 0.1) == 0.0


def test_the_fewest_encoders_whose_wait_is_under_the_target() -> None:
    assert encoders_needed(0.0, 0.1, 0.0, 0.25) == 0
    assert encoders_needed(0.2, 0.1, 0.0, 0.25) == 1  # W(1) = 0.025 s
    # 9 images/s at 0.1 s each: 0.9 busy; one encoder waits 0.9 s, two wait far less
    assert encoders_needed(0.9, 0.1, 0.0, 0.25) == 2
    for load in (0.5, 2.7, 7.9, 31.0):
        needed = encoders_needed(load, 0.1, 0.0, 0.05)
        assert needed > load
        assert erlang_c_wait_s(needed, load, 0.1) <= 0.05
        assert erlang_c_wait_s(needed - 1, load, 0.1) > 0.05


def test_a_backlog_needs_the_encoders_that_clear_it_within_the_target() -> None:
    # 2 encoder-seconds queued, a 0.5 s target: 4 encoders on top of the load
    assert encoders_needed(0.0, 0.1, 2.0, 0.5) == 4
    assert encoders_needed(1.5, 0.1, 2.0, 0.5) == 6


def test_the_rate_is_smoothed_over_its_time_constant() -> None:
    rate = DecayingRate(10.0)
    for second in range(100):
        rate.add(5.0, float(second))  # 5 per second for 100 s
    assert rate.rate(99.0) == pytest.approx(5.0, rel=0.1)
    assert rate.rate(99.0 + 10.0) == pytest.approx(rate.rate(99.0) / math.e)
    assert DecayingRate(1.0).rate(5.0) == 0.0


def test_cache_hits_are_not_counted_as_work() -> None:
    tracker = DemandTracker(smoothing_s=10.0, target_wait_s=0.25)
    for second in range(50):
        tracker.arrivals(("m", device_kind("cuda:0"))).arrived(10.0, float(second))
        tracker.arrivals(("m", device_kind("cuda:1"))).done(10.0, second % 2 == 0, float(second))
    [demand] = tracker.demand({("m", "cuda"): KindState(2, (100.0, 100.0), 0.0)}, 50.0)
    assert (demand.model, demand.device, demand.num_live) == ("m", "cuda", 2)
    assert demand.cache_hit_ratio == pytest.approx(0.5, abs=0.05)
    assert demand.arrival_rate == pytest.approx(5.0, rel=0.1)
    assert demand.load == pytest.approx(demand.arrival_rate * 0.1)


def test_an_unmeasured_kind_needs_what_it_runs() -> None:
    tracker = DemandTracker(smoothing_s=10.0, target_wait_s=0.25)
    tracker.arrivals(("m", "cpu")).arrived(3.0, 0.0)
    [demand] = tracker.demand({("m", "cpu"): KindState(2, (), 0.0)}, 1.0)
    assert (demand.num_needed, demand.item_s, demand.load) == (2, None, 0.0)
    assert device_kind("cuda:3") == "cuda" and device_kind("") == "cpu"


def test_the_scheduler_needs_more_encoders_under_a_burst_and_none_once_quiet() -> None:
    scheduler, clock = create_scheduler(
        spec("e0"),
        spec("g0", device="cuda:0"),
        encode_wait_target_s=0.2,
        demand_smoothing_s=5.0,
        ttl_s=1000,
    )
    scheduler.heartbeat(scheduler.registry.get("e0").lease_id)  # type: ignore[union-attr]
    idle = {d.device: d for d in scheduler.encoder_demand()}
    assert {k: (d.num_live, d.num_needed) for k, d in idle.items()} == {
        "cpu": (1, 1),
        "cuda": (1, 1),
    }
    # 20 images/s for 10 s, each measured at 100 ms on whichever encoder took it
    for step in range(200):
        assignment = scheduler.assign_encoders([EncodeItem(f"h{step}")])
        scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, 100.0)])
        clock.now += 0.05
    burst = scheduler.encoder_demand(model="m")
    total_load = sum(d.load for d in burst)
    assert total_load == pytest.approx(2.0, rel=0.2)
    assert sum(d.num_needed for d in burst) >= 3
    assert all(d.num_needed > d.load for d in burst)
    for _ in range(12):
        clock.now += 5
        for worker in scheduler.registry.all():
            scheduler.heartbeat(worker.lease_id)
    assert [d.num_needed for d in scheduler.encoder_demand()] == [0, 0]
    assert scheduler.encoder_demand(model="other") == []


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="wait target"):
        create_scheduler(encode_wait_target_s=0)
    with pytest.raises(ValueError, match="smoothing"):
        create_scheduler(demand_smoothing_s=-1)


def test_the_signal_is_exported_with_units_in_its_names() -> None:
    scheduler, clock = create_scheduler(spec("e0"), spec("e1"), ttl_s=1000, demand_smoothing_s=1)
    registry = CollectorRegistry()
    register_scheduler_metrics(scheduler, registry)
    for step in range(100):
        assignment = scheduler.assign_encoders([EncodeItem(f"h{step}")])
        scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, 50.0)])
        clock.now += 0.02
    [demand] = scheduler.encoder_demand()
    text = generate_latest(registry).decode()
    scraped = [s for f in text_string_to_metric_families(text) for s in f.samples]
    labels = {"model": "m", "device": "cpu"}
    assert value(scraped, "epd_scheduler_encoders_needed", **labels) == demand.num_needed > 2
    assert value(scraped, "epd_scheduler_encoders_live", **labels) == 2
    load = value(scraped, "epd_scheduler_encode_load_encoders", **labels)
    assert load == pytest.approx(demand.load)
    rate = value(scraped, "epd_scheduler_encode_arrivals_images_per_second", **labels)
    cost = value(scraped, "epd_scheduler_encode_image_cost_seconds", **labels)
    assert rate * cost == pytest.approx(load)
    assert value(scraped, "epd_scheduler_encode_wait_target_seconds") == 0.25


def test_the_cost_is_smoothed_over_time() -> None:
    tracker = DemandTracker(smoothing_s=10.0, target_wait_s=0.25)
    tracker.arrivals(("m", "cpu")).arrived(1.0, 0.0)
    first = tracker.demand({("m", "cpu"): KindState(1, (100.0,), 0.0)}, 0.0)[0]
    jumped = tracker.demand({("m", "cpu"): KindState(1, (300.0,), 0.0)}, 10.0)[0]
    assert first.item_s == pytest.approx(0.1)
    assert jumped.item_s == pytest.approx(0.1 + 0.2 * (1 - math.exp(-1)))
