"""The adaptive policy compares encoders by one kind of service time. The scheduler infers one
from completions (the latency the route saw: everything around the tower included) and takes
another from each encoder's heartbeats (its own compute time per item, smaller); the encoder's
own arrives at its first heartbeat with a figure, one encoder before the other. Judging one
twin by its own figure and the other by the inferred one sent a clip's two chunks to the first
(docs/benchmarks/video.md, "adaptive against per_image"); each kind is compared with its kind."""

from __future__ import annotations

from collections import Counter

import pytest

from epd.scheduler.core import Scheduler
from epd.scheduler.model import EncodeItem, ItemOutcome, Load, Policy
from tests.unit.scheduler.factories import create_scheduler, spec

INFERRED_MS, OWN_MS = 28.0, 12.0


def clip(scheduler: Scheduler, n: int) -> list[str]:
    """The encoders a clip's two chunks are placed on (then encoded, as the route saw it, in
    INFERRED_MS each)."""
    chunks = [EncodeItem(f"clip{n}-{i}", num_tokens=162) for i in range(2)]
    work = scheduler.assign_encoders(chunks, policy=Policy.ADAPTIVE)
    scheduler.complete_encoding(work.assignment_id, [ItemOutcome(i, INFERRED_MS) for i in range(2)])
    return list(work.worker_ids)


def twins_measured_by_completions() -> Scheduler:
    """Twins a and b, each having encoded chunks in INFERRED_MS as the route saw them."""
    scheduler, _ = create_scheduler(spec("a"), spec("b"))
    for n in range(4):
        work = scheduler.assign_encoders(
            [EncodeItem(f"warm{n}-{i}", num_tokens=162) for i in range(2)],
            policy=Policy.PER_IMAGE,
        )
        outcomes = [ItemOutcome(i, INFERRED_MS) for i in range(2)]
        scheduler.complete_encoding(work.assignment_id, outcomes)
    return scheduler


def heartbeat(scheduler: Scheduler, worker_id: str, item_ms: float) -> None:
    lease = next(w.lease_id for w in scheduler.registry.all() if w.id == worker_id)
    scheduler.heartbeat(lease, Load(item_latency_ms=item_ms))


def test_a_twin_with_its_own_figure_is_not_compared_with_the_others_inferred_one() -> None:
    scheduler = twins_measured_by_completions()
    heartbeat(scheduler, "a", OWN_MS)  # NOTE: b's first heartbeat with a figure is to come
    assert scheduler.service_ms("a") == OWN_MS and scheduler.service_ms("b") == INFERRED_MS
    assert all(sorted(clip(scheduler, n)) == ["a", "b"] for n in range(6))


def test_once_every_encoder_has_its_own_figure_those_are_compared() -> None:
    scheduler = twins_measured_by_completions()
    heartbeat(scheduler, "a", OWN_MS)
    heartbeat(scheduler, "b", 4 * OWN_MS)  # NOTE: b really is slower: a finishes both sooner
    assert Counter(w for n in range(6) for w in clip(scheduler, n)) == {"a": 12}


def test_an_idle_encoders_repeated_figure_counts_once() -> None:
    """An idle encoder's heartbeats repeat its last batch's figure: one slow batch reported by
    ten heartbeats pulled its estimate to that batch's alone (docs/benchmarks/video.md). A
    figure counts as a sample only when the encoder finished another batch."""
    scheduler, _ = create_scheduler(spec("a"))
    lease = next(w.lease_id for w in scheduler.registry.all() if w.id == "a")
    scheduler.heartbeat(lease, Load(item_latency_ms=10.0, batches_finished=1))
    for _ in range(10):
        scheduler.heartbeat(lease, Load(item_latency_ms=100.0, batches_finished=2))
    assert scheduler.service_ms("a") == pytest.approx(0.3 * 100.0 + 0.7 * 10.0)


def test_a_worker_that_counts_no_batches_reports_every_figure() -> None:
    scheduler, _ = create_scheduler(spec("a"))
    heartbeat(scheduler, "a", 10.0)
    heartbeat(scheduler, "a", 100.0)
    heartbeat(scheduler, "a", 100.0)
    assert scheduler.service_ms("a") == pytest.approx(0.3 * 100.0 + 0.7 * (0.3 * 100.0 + 7.0))


def test_a_reregistered_encoder_counts_its_batches_anew() -> None:
    scheduler, _ = create_scheduler(spec("a"))
    lease = next(w.lease_id for w in scheduler.registry.all() if w.id == "a")
    scheduler.heartbeat(lease, Load(item_latency_ms=10.0, batches_finished=1))
    scheduler.deregister(lease)
    lease = scheduler.register(spec("a")).lease_id
    scheduler.heartbeat(lease, Load(item_latency_ms=40.0, batches_finished=1))
    assert scheduler.service_ms("a") == pytest.approx(40.0)
