"""ListModels counts each model's workers by role label; a role this build does not know is
counted as ``unknown`` and never enters the route's view of the live roles."""

from __future__ import annotations

from typing import Any

from epd.common.roles import Role
from epd.server.route.topology import RoleView
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.unit.route.fakes import FakePeers, text_router

UNKNOWN_ROLE = 99


def listing_with(role: int, model: str = "tiny") -> scheduler_pb.ListWorkersResponse:
    """One live worker of ``role`` (a raw WorkerRole number) serving ``model``."""
    info: Any = scheduler_pb.WorkerInfo(id="w", role=role, model=model)  # type: ignore[arg-type]
    status = scheduler_pb.WorkerStatus(info=info, state=scheduler_pb.WORKER_STATE_LIVE)
    return scheduler_pb.ListWorkersResponse(workers=[status])


async def test_workers_are_counted_by_role_label() -> None:
    router = text_router(FakePeers())
    assert await router.list_models() == {"tiny": {"encode": 2, "prefill_decode": 1, "decode": 1}}


async def test_a_role_this_build_does_not_know_is_counted_as_unknown() -> None:
    peers = FakePeers()

    async def list_workers(request: Any, timeout: float | None = None) -> Any:
        return listing_with(UNKNOWN_ROLE)

    peers.scheduler.ListWorkers = list_workers  # type: ignore[method-assign]
    assert await text_router(peers).list_models() == {"tiny": {"unknown": 1}}


def test_the_view_of_live_roles_leaves_unknown_and_unspecified_roles_out() -> None:
    view = RoleView()
    for role in (UNKNOWN_ROLE, scheduler_pb.WORKER_ROLE_UNSPECIFIED):
        view.update(listing_with(role))
        assert view.roles("tiny") == frozenset() and view.models == {"tiny"}
    view.update(listing_with(scheduler_pb.WORKER_ROLE_DECODE))
    assert view.roles("tiny") == {Role.DECODE}
