"""The path a request takes follows the roles registered."""

from __future__ import annotations

import pytest

from epd.common.errors import DeadlineExceeded
from epd.server.route.deadline import Deadline
from epd.server.route.topology import (
    DECODE,
    ENCODE,
    ENCODE_PREFILL,
    PREFILL,
    PREFILL_DECODE,
    RoleView,
    hands_off_kv,
    plan_for,
)
from epd.v1 import scheduler_service_pb2 as scheduler_pb


@pytest.mark.parametrize(
    ("roles", "num_images", "uses_encoders", "prefill_roles"),
    [
        ({ENCODE, PREFILL_DECODE}, 2, True, (PREFILL_DECODE, PREFILL, ENCODE_PREFILL)),  # E/PD
        ({ENCODE, PREFILL, DECODE}, 1, True, (PREFILL_DECODE, PREFILL, ENCODE_PREFILL)),  # E/P/D
        ({ENCODE_PREFILL}, 1, False, (ENCODE_PREFILL,)),  # EPD
        ({ENCODE_PREFILL, DECODE}, 3, False, (ENCODE_PREFILL,)),  # EP/D
        ({ENCODE, ENCODE_PREFILL}, 1, True, (PREFILL_DECODE, PREFILL, ENCODE_PREFILL)),
        ({ENCODE_PREFILL}, 0, False, (PREFILL_DECODE, PREFILL, ENCODE_PREFILL)),  # text only
    ],
)
def test_plan_follows_the_live_roles(roles, num_images, uses_encoders, prefill_roles) -> None:
    plan = plan_for(frozenset(roles), num_images)
    assert plan.uses_encoders is uses_encoders
    assert plan.prefill_roles == prefill_roles


def test_kv_goes_to_decode_only_from_prefill_or_encode_prefill_beside_decoders() -> None:
    assert hands_off_kv(PREFILL, frozenset({PREFILL}))
    assert hands_off_kv(ENCODE_PREFILL, frozenset({ENCODE_PREFILL, DECODE}))
    assert not hands_off_kv(ENCODE_PREFILL, frozenset({ENCODE_PREFILL}))
    assert not hands_off_kv(PREFILL_DECODE, frozenset({PREFILL_DECODE, DECODE}))


def worker(model: str, role: int, state: int = scheduler_pb.WORKER_STATE_LIVE) -> object:
    return scheduler_pb.WorkerStatus(
        info=scheduler_pb.WorkerInfo(model=model, role=role), state=state
    )  # type: ignore[arg-type]


def test_role_view_keeps_live_workers_per_model_and_expires() -> None:
    view = RoleView(ttl_s=1.0)
    assert view.is_stale(now=0.0)
    view.update(
        scheduler_pb.ListWorkersResponse(
            workers=[
                worker("a", ENCODE),
                worker("a", PREFILL_DECODE),
                worker("b", ENCODE_PREFILL),
                worker("a", DECODE, scheduler_pb.WORKER_STATE_DRAINING),
            ]
        ),
        now=10.0,
    )
    assert view.roles("a") == {ENCODE, PREFILL_DECODE}
    assert view.roles("") == {ENCODE, PREFILL_DECODE, ENCODE_PREFILL}
    assert view.roles("c") == frozenset()
    assert not view.is_stale(now=10.5)
    assert view.is_stale(now=11.5)


def test_deadline_counts_down_and_expires() -> None:
    assert Deadline(None).remaining() is None
    left = Deadline(5).remaining()
    assert left is not None and 4 < left <= 5
    with pytest.raises(DeadlineExceeded):
        Deadline(-1).remaining()
