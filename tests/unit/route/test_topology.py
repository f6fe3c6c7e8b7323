"""The path a request takes follows the roles registered."""

from __future__ import annotations

import pytest

from epd.common.errors import DeadlineExceeded
from epd.common.roles import Role, hands_off_kv
from epd.server.route.request import Deadline
from epd.server.route.topology import RoleView, can_serve, plan_for
from epd.v1 import scheduler_service_pb2 as scheduler_pb


@pytest.mark.parametrize(
    ("roles", "num_images", "uses_encoders", "prefill_roles"),
    [
        (
            {Role.ENCODE, Role.PREFILL_DECODE},
            2,
            True,
            (Role.PREFILL_DECODE, Role.PREFILL, Role.ENCODE_PREFILL),
        ),  # E/PD
        (
            {Role.ENCODE, Role.PREFILL, Role.DECODE},
            1,
            True,
            (Role.PREFILL_DECODE, Role.PREFILL, Role.ENCODE_PREFILL),
        ),  # E/P/D
        ({Role.ENCODE_PREFILL}, 1, False, (Role.ENCODE_PREFILL,)),  # EPD
        ({Role.ENCODE_PREFILL, Role.DECODE}, 3, False, (Role.ENCODE_PREFILL,)),  # EP/D
        (
            {Role.ENCODE, Role.ENCODE_PREFILL},
            1,
            True,
            (Role.PREFILL_DECODE, Role.PREFILL, Role.ENCODE_PREFILL),
        ),
        (
            {Role.ENCODE_PREFILL},
            0,
            False,
            (Role.PREFILL_DECODE, Role.PREFILL, Role.ENCODE_PREFILL),
        ),  # text only
    ],
)
def test_plan_follows_the_live_roles(roles, num_images, uses_encoders, prefill_roles) -> None:
    plan = plan_for(frozenset(roles), num_images)
    assert plan.uses_encoders is uses_encoders
    assert plan.prefill_roles == prefill_roles
    assert plan.is_decode_live is (Role.DECODE in roles)


@pytest.mark.parametrize(
    ("roles", "num_media", "served"),
    [
        ({Role.ENCODE, Role.PREFILL_DECODE}, 1, True),  # E/PD
        ({Role.ENCODE, Role.PREFILL, Role.DECODE}, 1, True),  # E/P/D
        ({Role.ENCODE_PREFILL}, 1, True),  # EPD
        ({Role.ENCODE_PREFILL, Role.DECODE}, 1, True),  # EP/D
        ({Role.PREFILL_DECODE}, 0, True),  # text without encoders
        (set(), 0, False),
        ({Role.DECODE}, 1, False),  # EP/D's decode worker listed before its encode_prefill
        ({Role.DECODE}, 0, False),
        ({Role.PREFILL_DECODE}, 1, False),  # E/PD's worker listed before its encoders
        ({Role.ENCODE, Role.DECODE}, 1, False),  # E/P/D without its prefill worker yet
        ({Role.ENCODE, Role.PREFILL}, 1, False),  # E/P/D without its decode worker yet
    ],
)
def test_a_view_serves_a_request_only_with_every_role_its_plan_needs(
    roles, num_media, served
) -> None:
    assert can_serve(frozenset(roles), num_media) is served


def test_kv_goes_to_decode_only_from_prefill_or_encode_prefill_beside_decoders() -> None:
    assert hands_off_kv(Role.PREFILL, is_decode_live=False)
    assert hands_off_kv(Role.ENCODE_PREFILL, is_decode_live=True)
    assert not hands_off_kv(Role.ENCODE_PREFILL, is_decode_live=False)
    assert not hands_off_kv(Role.PREFILL_DECODE, is_decode_live=True)


def worker(model: str, role: Role, state: int = scheduler_pb.WORKER_STATE_LIVE) -> object:
    return scheduler_pb.WorkerStatus(
        info=scheduler_pb.WorkerInfo(model=model, role=role.value), state=state
    )  # type: ignore[arg-type]


def test_role_view_keeps_live_workers_per_model_and_expires() -> None:
    view = RoleView(ttl_s=1.0)
    assert view.is_expired(now=0.0)
    view.update(
        scheduler_pb.ListWorkersResponse(
            workers=[
                worker("a", Role.ENCODE),
                worker("a", Role.PREFILL_DECODE),
                worker("b", Role.ENCODE_PREFILL),
                worker("a", Role.DECODE, scheduler_pb.WORKER_STATE_DRAINING),
            ]
        ),
        now=10.0,
    )
    assert view.roles("a") == {Role.ENCODE, Role.PREFILL_DECODE}
    assert view.roles("") == {Role.ENCODE, Role.PREFILL_DECODE, Role.ENCODE_PREFILL}
    assert view.roles("c") == frozenset()
    assert not view.is_expired(now=10.0 + view.max_age_s - 0.5)
    assert view.is_expired(now=10.0 + view.max_age_s + 0.5)


def test_deadline_counts_down_and_expires() -> None:
    assert Deadline(None).remaining() is None
    left = Deadline(5).remaining()
    assert left is not None and 4 < left <= 5
    with pytest.raises(DeadlineExceeded):
        Deadline(-1).remaining()
