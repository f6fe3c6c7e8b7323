"""The route's view of the live roles is refreshed off the requests' path, by the scheduler
listing's one refresh loop (``FallbackScheduler.refresh``, every second under ``watch``): a stale
view is served and no request asks for a listing; a request waits for ListWorkers only without a
view, with an expired one, or with one that has no live role for its model."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from epd.common.roles import Role
from epd.server.route.peers import Peers
from epd.server.route.router import Router
from epd.server.route.scheduler_fallback import FallbackScheduler
from epd.server.route.topology import MAX_AGE_TTLS, RoleView
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.unit.route.fakes import FakePeers, generate, text_router
from tests.unit.route.test_scheduler_fallback import DownableScheduler, Health

TTL_S = RoleView().ttl_s


class HeldListWorkers:
    """The fake scheduler's ListWorkers, answered only once ``go`` is set."""

    def __init__(self, peers: FakePeers) -> None:
        self.answer = peers.scheduler.ListWorkers
        self.go = asyncio.Event()
        self.num_started = 0
        self.num_answered = 0
        peers.scheduler.ListWorkers = self  # type: ignore[method-assign]

    async def __call__(self, request: Any, timeout: float | None = None) -> Any:
        self.num_started += 1
        await self.go.wait()
        self.num_answered += 1
        return await self.answer(request, timeout)


async def waits_for_the_listing(worker: Router, peers: FakePeers) -> None:
    """A request to ``worker`` waits for one ListWorkers, then is answered."""
    list_workers = HeldListWorkers(peers)
    request = asyncio.ensure_future(generate(worker, "tiny"))
    await asyncio.sleep(0.05)
    assert not request.done() and list_workers.num_started == 1
    list_workers.go.set()
    assert len(await asyncio.wait_for(request, 5)) == 3


async def router_with_view(
    age_s: float, listing: scheduler_pb.ListWorkersResponse | None = None
) -> tuple[Router, FakePeers]:
    """A text router whose view is ``listing`` (default: the fake scheduler's) of ``age_s`` ago."""
    peers = FakePeers()
    worker = text_router(peers)
    if listing is None:
        listing = await peers.scheduler.ListWorkers(scheduler_pb.ListWorkersRequest())
    worker.roles.update(listing, now=time.monotonic() - age_s)
    return worker, peers


async def test_a_stale_view_is_served_and_no_request_lists_the_workers() -> None:
    worker, peers = await router_with_view(age_s=2 * TTL_S)
    list_workers = HeldListWorkers(peers)
    assert len(await asyncio.wait_for(generate(worker, "tiny"), 5)) == 3
    await generate(worker, "tiny")
    await peers.background.settle()
    assert list_workers.num_started == 0  # NOTE: the refresh loop's job, not the requests'


async def test_an_expired_view_makes_the_request_wait_for_the_listing() -> None:
    worker, peers = await router_with_view(age_s=(MAX_AGE_TTLS + 1) * TTL_S)
    await waits_for_the_listing(worker, peers)


async def test_a_stale_view_without_a_live_role_of_the_model_waits_for_the_listing() -> None:
    worker, peers = await router_with_view(2 * TTL_S, scheduler_pb.ListWorkersResponse())
    list_workers = HeldListWorkers(peers)
    request = asyncio.ensure_future(generate(worker, "tiny"))
    await asyncio.sleep(0.05)
    assert not request.done()  # NOTE: the model's workers may have registered since
    list_workers.go.set()
    assert len(await asyncio.wait_for(request, 5)) == 3


async def test_a_fresh_view_without_a_live_role_of_the_model_waits_once_per_ttl() -> None:
    """The watch listed the workers before the model's registered (a route that just started):
    the first request waits for a listing; another within the TTL does not ask again."""
    worker, peers = await router_with_view(0.0, scheduler_pb.ListWorkersResponse())
    list_workers = HeldListWorkers(peers)
    first = asyncio.ensure_future(generate(worker, "tiny"))
    await asyncio.sleep(0.05)
    assert not first.done() and list_workers.num_started == 1
    assert len(await asyncio.wait_for(generate(worker, "tiny"), 5)) == 3
    assert list_workers.num_started == 1
    list_workers.go.set()
    assert len(await asyncio.wait_for(first, 5)) == 3


async def test_a_fresh_view_missing_a_role_the_request_needs_waits_for_the_listing() -> None:
    """The watch listed an EP/D deployment's decode worker before its encode_prefill worker
    registered: a request waits for a listing instead of planning encoders the deployment does
    not have (CI: EP/D's first requests failed 'no live encoder for model tiny')."""
    decode_only = scheduler_pb.ListWorkersResponse(
        workers=[
            scheduler_pb.WorkerStatus(
                info=scheduler_pb.WorkerInfo(id="dec0", model="tiny", role=Role.DECODE.value),
                state=scheduler_pb.WORKER_STATE_LIVE,
            )
        ]
    )
    worker, peers = await router_with_view(0.0, decode_only)
    await waits_for_the_listing(worker, peers)


async def test_the_listings_refresh_feeds_the_view_and_a_failed_one_keeps_it_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    remote, view = DownableScheduler(), RoleView()
    fallback = FallbackScheduler(remote, Health(), 0, on_listing=view.update)  # type: ignore[arg-type]
    assert view.is_expired()
    await fallback.refresh()
    assert view.roles("tiny") == {Role.ENCODE, Role.PREFILL_DECODE, Role.DECODE}
    assert not view.is_expired()
    remote.scheduler.encoders = []
    remote.is_down = True
    with caplog.at_level(logging.WARNING):
        await fallback.refresh()
        await fallback.refresh()
    assert Role.ENCODE in view.roles("tiny")  # NOTE: kept as it was
    assert caplog.text.count("could not refresh the workers' listing") == 1
    remote.is_down = False
    await fallback.refresh()
    assert view.roles("tiny") == {Role.PREFILL_DECODE, Role.DECODE}


async def test_while_degraded_the_view_leaves_out_the_workers_failing_their_health_check() -> None:
    remote, health, view = DownableScheduler(), Health(failing={"enc0", "enc1"}), RoleView()
    fallback = FallbackScheduler(remote, health, 60, on_listing=view.update)  # type: ignore[arg-type]
    await fallback.refresh()
    assert Role.ENCODE in view.roles("tiny")
    remote.is_down = True
    await fallback.refresh()
    assert fallback.is_degraded and view.roles("tiny") == {Role.PREFILL_DECODE, Role.DECODE}


def test_a_view_expires_after_its_max_age() -> None:
    view = RoleView(ttl_s=1.0, max_age_s=5.0)
    assert view.is_expired(now=0.0)
    view.update(scheduler_pb.ListWorkersResponse(), now=100.0)
    assert not view.is_expired(now=104.0)
    assert view.is_expired(now=105.5)
    assert RoleView(ttl_s=2.0).max_age_s == MAX_AGE_TTLS * 2.0
    with pytest.raises(ValueError):
        RoleView(ttl_s=1.0, max_age_s=0.5)


async def test_the_listing_is_refreshed_with_the_scheduler_fallback_off_too() -> None:
    peers = Peers("127.0.0.1:1", scheduler_fallback_s=0)
    refreshed = asyncio.Event()

    async def refresh() -> None:
        peers.roles.update(scheduler_pb.ListWorkersResponse())
        refreshed.set()

    peers.scheduler.refresh = refresh  # type: ignore[method-assign]
    assert peers.roles.is_expired()
    peers.start()
    await asyncio.wait_for(refreshed.wait(), 5)
    assert not peers.roles.is_expired()
    await peers.close()
