"""What is held where: the encoders' held-item deltas, the store's holdings and single flight,
in the index and in every policy's placement."""

from __future__ import annotations

import pytest

from epd.common.held_items import HeldReport
from epd.scheduler.holdings import STORE, Holdings
from epd.scheduler.model import EncodeItem, ItemOutcome, Load, Policy
from tests.unit.scheduler.factories import create_scheduler, spec

POLICIES = list(Policy)


def leases(scheduler) -> dict[str, str]:
    return {w.id: w.lease_id for w in scheduler.registry.all()}


def test_deltas_add_and_evict_and_a_snapshot_replaces() -> None:
    holdings = Holdings()
    holdings.apply("a", HeldReport(added=("x", "y")))
    holdings.apply("a", HeldReport(evicted=("x",), stored=("y",)))
    assert holdings.held_by("a") == ["y"] and holdings.held_by(STORE) == ["y"]
    holdings.apply("a", HeldReport(is_snapshot=True, added=("z",)))
    assert holdings.held_by("a") == ["z"]
    assert holdings.can_serve("b", "y") and not holdings.can_serve("b", "z")


def test_the_index_is_bounded_least_recently_used_first() -> None:
    holdings = Holdings(max_items=2)
    holdings.apply("a", HeldReport(added=("x", "y")))
    holdings.place([EncodeItem("x")], ["a"])  # x used again: y is the oldest
    holdings.apply("b", HeldReport(added=("z",)))
    assert len(holdings) == 2 and holdings.held_by("a") == ["x"]
    assert holdings.held_by("b") == ["z"]


def test_a_forgotten_holder_leaves_no_trace() -> None:
    holdings = Holdings()
    holdings.apply("a", HeldReport(added=("x",)))
    holdings.start_encoding("y", "a")
    holdings.forget("a")
    assert holdings.place([EncodeItem("x"), EncodeItem("y")], ["a", "b"]) == [None, None]
    assert len(holdings) == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_reported_item_goes_to_its_holder_in_every_policy(policy) -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    lease = leases(scheduler)
    scheduler.heartbeat(lease["b"], Load(), held=HeldReport(added=("x",)))
    for _ in range(3):
        assignment = scheduler.assign_encoders([EncodeItem("x")], policy=policy)
        assert assignment.worker_ids == ("b",)
        scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, cache_hit=True)])
    scheduler.heartbeat(lease["b"], Load(), held=HeldReport(evicted=("x",)))
    chosen = set()
    for _ in range(4):
        assignment = scheduler.assign_encoders([EncodeItem("x")], policy=policy)
        chosen.update(assignment.worker_ids)
        scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, failed=True)])
    assert chosen == {"a", "b"}  # evicted: no affinity left


@pytest.mark.parametrize("policy", POLICIES)
def test_concurrent_requests_for_a_new_item_join_its_one_encoding(policy) -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"), spec("c"))
    first = scheduler.assign_encoders([EncodeItem("new"), EncodeItem("other")], policy=policy)
    (encoder,) = set(first.worker_ids[:1])
    joined = [scheduler.assign_encoders([EncodeItem("new")], policy=policy) for _ in range(5)]
    assert {a.worker_ids for a in joined} == {(encoder,)}
    assert scheduler.held_items(encoder) == []  # being encoded, not held yet
    for assignment in joined:
        scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, cache_hit=True)])
    scheduler.complete_encoding(first.assignment_id, [ItemOutcome(0, 30.0), ItemOutcome(1, 30.0)])
    assert "new" in scheduler.held_items(encoder)
    assert scheduler.assign_encoders([EncodeItem("new")], policy=policy).worker_ids == (encoder,)


def test_a_request_repeating_an_item_sends_it_to_one_encoder() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    assignment = scheduler.assign_encoders([EncodeItem("x")] * 4, policy=Policy.PER_IMAGE)
    assert len(set(assignment.worker_ids)) == 1


def test_a_failed_encoding_is_held_nowhere_and_not_joined() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    first = scheduler.assign_encoders([EncodeItem("x")], policy=Policy.PER_IMAGE)
    scheduler.complete_encoding(first.assignment_id, [ItemOutcome(0, failed=True)])
    assert scheduler.held_items("a") == scheduler.held_items("b") == []
    second = scheduler.assign_encoders([EncodeItem("x")], policy=Policy.PER_IMAGE)
    assert second.worker_ids != first.worker_ids  # round robin again, not pinned


def test_an_encoder_that_left_is_not_joined() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    first = scheduler.assign_encoders([EncodeItem("x")], policy=Policy.PER_IMAGE)
    (encoder,) = first.worker_ids
    other = ({"a", "b"} - {encoder}).pop()
    scheduler.deregister(leases(scheduler)[encoder])
    scheduler.complete_encoding(first.assignment_id, [ItemOutcome(0, 5.0)])
    assert scheduler.assign_encoders([EncodeItem("x")]).worker_ids == (other,)


def test_a_store_held_item_costs_no_tower_time_on_any_encoder() -> None:
    scheduler, _ = create_scheduler(spec("fast", device="cuda"), spec("slow"))
    lease = leases(scheduler)
    scheduler.heartbeat(lease["fast"], Load(item_latency_ms=10))
    scheduler.heartbeat(lease["slow"], Load(item_latency_ms=80))
    busy = scheduler.assign_encoders([EncodeItem(f"b{i}") for i in range(3)])
    assert busy.worker_ids == ("fast",) * 3  # 30 ms of backlog, still under 80 ms
    assert scheduler.assign_encoders([EncodeItem("cold")]).worker_ids == ("fast",)
    scheduler.heartbeat(lease["fast"], Load(item_latency_ms=10), held=HeldReport(stored=("s",)))
    assert scheduler.assign_encoders([EncodeItem("s")]).worker_ids == ("slow",)


def test_an_item_encoded_though_the_store_held_it_leaves_the_store() -> None:
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    scheduler.heartbeat(leases(scheduler)["a"], Load(), held=HeldReport(stored=("s",)))
    assert "s" in scheduler._holdings.held_by(STORE)
    assignment = scheduler.assign_encoders([EncodeItem("s")])
    scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, 40.0)])
    assert scheduler._holdings.held_by(STORE) == []
    assert scheduler.held_items(assignment.worker_ids[0]) == ["s"]


def test_a_listing_shows_a_bounded_part_of_what_is_held() -> None:
    holdings = Holdings()
    holdings.apply("a", HeldReport(added=tuple(f"h{i:03}" for i in range(300))))
    assert holdings.held_by("a", 256) == [f"h{i:03}" for i in range(256)]
    assert len(holdings.held_by("a")) == 300
