"""What the adaptive policy learned of each encoder survives a scheduler restart through the
encoders themselves: each measures its own per-item time and sends it in every heartbeat
(``WorkerLoad.item_latency_ms``), so a new scheduler has it back at the first heartbeat after
the encoder registers again, before any request; what it infers from completions starts over."""

from __future__ import annotations

from collections import Counter

from epd.scheduler.core import Scheduler
from epd.scheduler.model import EncodeItem, ItemOutcome, Load, Policy
from tests.unit.scheduler.factories import create_scheduler, spec

FAST_MS, SLOW_MS = 10.0, 40.0


def assigned(scheduler: Scheduler, num_items: int) -> Counter[str]:
    batch = [EncodeItem(f"i{n}") for n in range(num_items)]
    return Counter(scheduler.assign_encoders(batch, policy=Policy.ADAPTIVE).worker_ids)


def test_a_restarted_scheduler_has_the_encoder_speeds_back_at_the_first_heartbeat() -> None:
    encoders = (spec("fast", device="cuda"), spec("slow"))
    before, _ = create_scheduler(*encoders)
    leases = {w.id: w.lease_id for w in before.registry.all()}
    for _ in range(5):  # NOTE: a while of traffic: heartbeats and completed assignments
        before.heartbeat(leases["fast"], Load(item_latency_ms=FAST_MS))
        before.heartbeat(leases["slow"], Load(item_latency_ms=SLOW_MS))
        work = before.assign_encoders([EncodeItem("a"), EncodeItem("b")], policy=Policy.PER_IMAGE)
        outcomes = [ItemOutcome(0, FAST_MS), ItemOutcome(1, SLOW_MS)]
        before.complete_encoding(work.assignment_id, outcomes)
    learned = {e: before.service_ms(e) for e in ("fast", "slow")}

    after, _ = create_scheduler(*encoders)  # NOTE: registered again: nothing learned yet
    assert after.service_ms("fast") is None and after.service_ms("slow") is None
    leases = {w.id: w.lease_id for w in after.registry.all()}
    after.heartbeat(leases["fast"], Load(item_latency_ms=FAST_MS))
    after.heartbeat(leases["slow"], Load(item_latency_ms=SLOW_MS))

    assert {e: after.service_ms(e) for e in ("fast", "slow")} == learned
    assert learned == {"fast": FAST_MS, "slow": SLOW_MS}
    placed = assigned(after, 10)
    assert placed["fast"] == 4 * placed["slow"]  # 10 ms vs 40 ms an item: 8 and 2
