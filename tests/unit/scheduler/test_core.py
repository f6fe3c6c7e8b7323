"""The Scheduler facade: assignments with in-flight accounting and learning, routing choices."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from epd.common.errors import InvalidArgument, Unavailable
from epd.common.held_items import HeldReport
from epd.common.roles import Role
from epd.scheduler.config import SchedulerConfig
from epd.scheduler.core import Scheduler
from epd.scheduler.model import EncodeItem, ItemOutcome, Load, Policy
from tests.unit.scheduler.factories import FakeClock, create_scheduler, spec


def items(count: int, prefix: str = "h") -> list[EncodeItem]:
    return [EncodeItem(f"{prefix}{i}") for i in range(count)]


def test_no_encoder_is_unavailable_with_a_clear_message() -> None:
    scheduler, _ = create_scheduler(spec("p", Role.PREFILL))
    with pytest.raises(Unavailable, match="no live encoder") as caught:
        scheduler.assign_encoders(items(1))
    assert caught.value.reason == "NO_ENCODER"
    with pytest.raises(InvalidArgument):
        scheduler.assign_encoders([])


def test_only_live_encoders_of_the_model_are_chosen() -> None:
    scheduler, clock = create_scheduler(spec("a", model="m"), spec("b", model="other"), ttl_s=5)
    assignment = scheduler.assign_encoders(items(3), model="m", policy=Policy.PER_IMAGE)
    assert assignment.worker_ids == ("a", "a", "a")
    clock.now += 6
    with pytest.raises(Unavailable):
        scheduler.assign_encoders(items(1), model="m")


def test_exclusions_route_a_retry_elsewhere() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    for _ in range(3):
        assert set(scheduler.assign_encoders(items(2), exclude=["a"]).worker_ids) == {"b"}


def test_in_flight_counts_rise_on_assign_and_fall_on_completion() -> None:
    scheduler, _ = create_scheduler(spec("a"))
    assignment = scheduler.assign_encoders(items(3), policy=Policy.PER_REQUEST)
    worker = scheduler.registry.get("a")
    assert worker is not None and worker.num_assigned_in_flight == 3
    scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(i, 30.0) for i in range(3)])
    assert worker.num_assigned_in_flight == 0
    scheduler.complete_encoding(assignment.assignment_id, [])
    assert worker.num_assigned_in_flight == 0


def test_abandoned_assignments_expire() -> None:
    scheduler, clock = create_scheduler(spec("a"), assignment_timeout_s=60, ttl_s=1000)
    scheduler.assign_encoders(items(2))
    clock.now += 61
    scheduler.assign_encoders(items(1))
    assert scheduler.registry.get("a").num_assigned_in_flight == 1  # type: ignore[union-attr]


def test_adaptive_learns_a_wrong_ratio_from_completions() -> None:
    scheduler, _ = create_scheduler(
        spec("cpu", device="cpu"), spec("gpu", device="cuda:0"), split_ratio=(1.0, 1.0)
    )
    first = scheduler.assign_encoders(items(2), policy=Policy.ADAPTIVE)
    assert sorted(first.worker_ids) == ["cpu", "gpu"]
    outcomes = [
        ItemOutcome(i, 80.0 if worker == "cpu" else 10.0)
        for i, worker in enumerate(first.worker_ids)
    ]
    scheduler.complete_encoding(first.assignment_id, outcomes)
    second = scheduler.assign_encoders(items(4, "x"), policy=Policy.ADAPTIVE)
    assert second.worker_ids == ("gpu",) * 4


def test_heartbeat_latency_and_cache_feed_adaptive() -> None:
    scheduler, _ = create_scheduler(spec("cpu"), spec("gpu", device="cuda"))
    lease = {w.id: w.lease_id for w in scheduler.registry.all()}
    scheduler.heartbeat(lease["cpu"], Load(item_latency_ms=80), held=HeldReport(added=("x",)))
    scheduler.heartbeat(lease["gpu"], Load(item_latency_ms=10))
    assert scheduler.assign_encoders([EncodeItem("x")]).worker_ids == ("cpu",)
    assert scheduler.assign_encoders([EncodeItem("y")]).worker_ids == ("gpu",)


def test_completed_items_make_their_encoder_a_cache_home() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    first = scheduler.assign_encoders([EncodeItem("img")], policy=Policy.PER_IMAGE)
    scheduler.complete_encoding(first.assignment_id, [ItemOutcome(0, 5.0)])
    for _ in range(3):
        again = scheduler.assign_encoders([EncodeItem("img")], policy=Policy.ADAPTIVE)
        assert again.worker_ids == first.worker_ids
        scheduler.complete_encoding(again.assignment_id, [ItemOutcome(0, 1.0, cache_hit=True)])


def test_choose_prefill_by_longest_prefix_then_load() -> None:
    scheduler, _ = create_scheduler(
        spec("p1", Role.PREFILL_DECODE), spec("p2", Role.PREFILL_DECODE)
    )
    lease = {w.id: w.lease_id for w in scheduler.registry.all()}
    scheduler.heartbeat(lease["p1"], Load(num_in_flight=3))
    worker, cached = scheduler.choose_prefill([11, 12, 13])
    assert (worker.id, cached) == ("p2", 0)
    worker, cached = scheduler.choose_prefill([11, 12, 99])
    assert (worker.id, cached) == ("p2", 2)
    scheduler.heartbeat(lease["p1"], Load(), stored_blocks=[11, 12, 99])
    worker, cached = scheduler.choose_prefill([11, 12, 99, 100])
    assert (worker.id, cached) == ("p1", 3)
    with pytest.raises(Unavailable):
        scheduler.choose_prefill([1], exclude=["p1", "p2"])


def test_choose_decode_by_load() -> None:
    scheduler, _ = create_scheduler(spec("d1", Role.DECODE), spec("d2", Role.DECODE))
    lease = {w.id: w.lease_id for w in scheduler.registry.all()}
    scheduler.heartbeat(lease["d1"], Load(num_in_flight=5))
    assert scheduler.choose_decode().id == "d2"
    with pytest.raises(Unavailable, match="decode"):
        scheduler.choose_decode(exclude=["d1", "d2"])


def test_concurrent_assignments_keep_counts_consistent() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"), spec("c"))
    ids: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            # NOTE: items without a hash: a repeated one would join its first encoding
            assignment = scheduler.assign_encoders([EncodeItem()] * 2, policy=Policy.PER_IMAGE)
            with lock:
                ids.extend(assignment.worker_ids)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = {w: ids.count(w) for w in "abc"}
    assert counts == {"a": 534, "b": 533, "c": 533}
    assert sum(w.num_assigned_in_flight for w in scheduler.registry.all()) == 1600


def test_deregistered_worker_drains_its_in_flight_work_then_leaves() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    lease = {w.id: w.lease_id for w in scheduler.registry.all()}
    assignment = scheduler.assign_encoders(items(1), policy=Policy.PER_IMAGE)
    (busy,) = assignment.worker_ids
    scheduler.deregister(lease[busy])
    (draining,) = [w for w in scheduler.registry.all() if w.id == busy]
    assert draining.draining and draining.num_assigned_in_flight == 1
    for _ in range(3):
        assert busy not in scheduler.assign_encoders(items(2)).worker_ids
    scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, 5.0)])
    assert busy not in [w.id for w in scheduler.registry.all()]


def test_idle_deregistered_worker_leaves_at_once() -> None:
    scheduler, _ = create_scheduler(spec("a"))
    (worker,) = scheduler.registry.all()
    scheduler.deregister(worker.lease_id)
    assert scheduler.registry.all() == []


def test_evicted_worker_comes_back_with_nothing_remembered() -> None:
    scheduler, clock = create_scheduler(spec("p1", Role.PREFILL), spec("p2", Role.PREFILL), ttl_s=5)
    first, _ = scheduler.choose_prefill([1, 2, 3])
    other = "p2" if first.id == "p1" else "p1"
    clock.now += 4
    scheduler.heartbeat(scheduler.registry.get(other).lease_id)  # type: ignore[union-attr]
    clock.now += 2
    assert [w.id for w in scheduler.registry.all()] == [other]
    scheduler.register(spec(first.id, Role.PREFILL))
    worker, cached = scheduler.choose_prefill([1, 2, 3])
    assert cached == 0 and worker.id == first.id  # its KV cache is gone; by load, ids break ties
    scheduler.heartbeat(scheduler.registry.get(other).lease_id)  # type: ignore[union-attr]


def test_a_new_registration_is_not_charged_for_its_predecessors_work() -> None:
    scheduler, _ = create_scheduler(spec("a"))
    assignment = scheduler.assign_encoders(items(3))
    scheduler.register(spec("a"))  # the worker restarted at the same endpoint
    scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(i, 9.0) for i in range(3)])
    (worker,) = scheduler.registry.all()
    assert worker.num_assigned_in_flight == 0
    scheduler.assign_encoders(items(1))
    assert worker.num_assigned_in_flight == 1


def test_work_that_closes_after_its_worker_left_teaches_its_successor_nothing() -> None:
    scheduler, _ = create_scheduler(spec("a"))
    (before,) = scheduler.registry.all()
    assignment = scheduler.assign_encoders(items(2))
    scheduler.deregister(before.lease_id)  # draining: its work is in flight
    scheduler.register(spec("a"))  # the worker restarted at the same endpoint
    scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(i, 9.0) for i in range(2)])
    (after,) = scheduler.registry.all()
    assert after is not before and not after.has_left and before.has_left
    assert scheduler.service_ms("a") is None and scheduler.held_items("a") == []


def test_forgotten_encoder_is_no_longer_a_cache_home() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    first = scheduler.assign_encoders([EncodeItem("img")], policy=Policy.PER_IMAGE)
    scheduler.complete_encoding(first.assignment_id, [ItemOutcome(0, 5.0)])
    (home,) = first.worker_ids
    assert scheduler.held_items(home) == ["img"]
    scheduler.register(spec(home))  # restarted: its encoder cache is empty
    assert scheduler.held_items(home) == []
    chosen = set()
    for _ in range(2):
        again = scheduler.assign_encoders([EncodeItem("img")])
        chosen.add(again.worker_ids)
        # NOTE: failed, so it is held nowhere and the next one is not sent to join it
        scheduler.complete_encoding(again.assignment_id, [ItemOutcome(0, failed=True)])
    assert chosen == {("a",), ("b",)}  # no affinity left: ties rotate


def test_empty_model_with_several_served_is_invalid() -> None:
    scheduler, _ = create_scheduler(spec("a", model="m1"), spec("b", model="m2"))
    with pytest.raises(InvalidArgument, match="several") as caught:
        scheduler.assign_encoders(items(1))
    assert caught.value.reason == "MODEL_REQUIRED"
    assert scheduler.assign_encoders(items(1), model="m2").worker_ids == ("b",)


def test_reported_latency_is_read_against_the_sizes_each_encoder_was_given() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    lease = {w.id: w.lease_id for w in scheduler.registry.all()}
    big = scheduler.assign_encoders(
        [EncodeItem("b0", 3000), EncodeItem("b1", 3000)], policy=Policy.PER_REQUEST
    )
    small = scheduler.assign_encoders(
        [EncodeItem("s0", 1000), EncodeItem("s1", 1000)], policy=Policy.PER_REQUEST
    )
    assert (big.worker_ids, small.worker_ids) == (("a", "a"), ("b", "b"))
    # the same speed per token: 3x the tokens per item, 3x the latency per item
    scheduler.heartbeat(lease["a"], Load(item_latency_ms=30))
    scheduler.heartbeat(lease["b"], Load(item_latency_ms=10))
    assert scheduler.service_ms("a") == pytest.approx(scheduler.service_ms("b"), rel=0.1)


def serve_singles(
    scheduler: Scheduler,
    clock: FakeClock,
    seconds: float,
    item_ms: dict[str, float],
    cold: Sequence[str] = (),
) -> list[str]:
    """Single-image requests every 20 ms, each done before the next (``item_ms`` on its encoder;
    3 s for the first item of a ``cold`` one); every second each encoder heartbeats the per-item
    time of its latest item. Returns the encoder chosen for each request."""
    chosen, latest, first = [], {}, set(cold)
    next_beat = clock.now + 1.0
    for index in range(round(seconds / 0.02)):
        assignment = scheduler.assign_encoders([EncodeItem(f"i{index}")], policy=Policy.ADAPTIVE)
        (worker_id,) = assignment.worker_ids
        latest[worker_id] = 3000.0 if worker_id in first else item_ms[worker_id]
        first.discard(worker_id)
        scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, latest[worker_id])])
        chosen.append(worker_id)
        clock.now += 0.02
        if clock.now >= next_beat:
            next_beat += 1.0
            for worker in scheduler.registry.all():
                scheduler.heartbeat(worker.lease_id, Load(item_latency_ms=latest.get(worker.id, 0)))
    return chosen


def test_adaptive_splits_encoders_measured_a_little_apart_evenly() -> None:
    scheduler, clock = create_scheduler(spec("a"), spec("b"))
    chosen = serve_singles(scheduler, clock, 20, {"a": 10.0, "b": 10.2})
    assert 0.4 <= chosen.count("b") / len(chosen) <= 0.6


def test_a_rejoined_encoder_with_a_cold_first_item_gets_its_share_back() -> None:
    scheduler, clock = create_scheduler(spec("a"), spec("b"))
    item_ms = {"a": 10.0, "b": 10.0}
    serve_singles(scheduler, clock, 10, item_ms)
    scheduler.register(spec("b"))  # restarted: a new process, its first batch slow
    chosen = serve_singles(scheduler, clock, 30, item_ms, cold=["b"])
    settled = chosen[len(chosen) // 3 :]  # from 10 s after the rejoin
    assert 0.4 <= settled.count("b") / len(settled) <= 0.6


def test_probe_horizon_must_be_positive() -> None:
    with pytest.raises(ValueError, match="probe_after_s"):
        SchedulerConfig(probe_after_s=0)
