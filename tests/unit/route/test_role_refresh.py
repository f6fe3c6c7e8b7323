"""The route's view of the live roles is refreshed off the requests' path: a stale view is served,
and refreshed in the background once the first token is out; a request waits for ListWorkers
only without a view, with an expired one, or with one that has no live role for its model."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from epd.common.errors import Unavailable
from epd.server.route.router import Router
from epd.server.route.topology import MAX_AGE_TTLS, RoleView
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.unit.route.fakes import FakePeers, generate, generate_request, text_router

TTL_S = RoleView().ttl_s


class HeldListWorkers:
    """The fake scheduler's ListWorkers, answered only once ``go`` is set (or failing)."""

    def __init__(self, peers: FakePeers, error: Exception | None = None) -> None:
        self.answer = peers.scheduler.ListWorkers
        self.error = error
        self.go = asyncio.Event()
        self.num_started = 0
        self.num_answered = 0
        peers.scheduler.ListWorkers = self  # type: ignore[method-assign]

    async def __call__(self, request: Any, timeout: float | None = None) -> Any:
        self.num_started += 1
        await self.go.wait()
        if self.error is not None:
            raise self.error
        self.num_answered += 1
        return await self.answer(request, timeout)


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


async def test_a_stale_view_is_served_and_refreshed_after_the_first_token() -> None:
    worker, peers = await router_with_view(age_s=2 * TTL_S)
    list_workers = HeldListWorkers(peers)
    stream = worker.generate(generate_request("tiny"))
    first = await asyncio.wait_for(anext(stream), 5)
    assert first.token_ids == [7] and list_workers.num_started == 0
    rest = [chunk async for chunk in stream]
    assert [token for chunk in rest for token in chunk.token_ids] == [8, 9]
    await asyncio.sleep(0)
    assert list_workers.num_started == 1  # NOTE: the refresh is under way, not waited for
    await generate(worker, "tiny")
    assert list_workers.num_started == 1  # NOTE: one refresh at a time
    list_workers.go.set()
    await peers.background.settle()
    assert list_workers.num_answered == 1 and not worker.roles.is_stale()


async def test_an_expired_view_makes_the_request_wait_for_the_listing() -> None:
    worker, peers = await router_with_view(age_s=(MAX_AGE_TTLS + 1) * TTL_S)
    list_workers = HeldListWorkers(peers)
    request = asyncio.ensure_future(generate(worker, "tiny"))
    await asyncio.sleep(0.05)
    assert not request.done() and list_workers.num_started == 1
    list_workers.go.set()
    assert len(await asyncio.wait_for(request, 5)) == 3


async def test_a_stale_view_without_a_live_role_of_the_model_waits_for_the_listing() -> None:
    worker, peers = await router_with_view(2 * TTL_S, scheduler_pb.ListWorkersResponse())
    list_workers = HeldListWorkers(peers)
    request = asyncio.ensure_future(generate(worker, "tiny"))
    await asyncio.sleep(0.05)
    assert not request.done()  # NOTE: the model's workers may have registered since
    list_workers.go.set()
    assert len(await asyncio.wait_for(request, 5)) == 3


async def test_a_failed_background_refresh_keeps_the_view_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker, peers = await router_with_view(age_s=2 * TTL_S)
    list_workers = HeldListWorkers(peers, Unavailable("scheduler down"))
    list_workers.go.set()
    with caplog.at_level(logging.WARNING):
        await generate(worker, "tiny")
        await peers.background.settle()
    assert list_workers.num_started == 1
    assert "could not refresh the live roles" in caplog.text
    assert len(await generate(worker, "tiny")) == 3  # NOTE: served from the kept view
    await peers.background.settle()
    assert list_workers.num_started == 1  # NOTE: the next try waits a TTL


def test_a_view_expires_after_its_max_age() -> None:
    view = RoleView(ttl_s=1.0, max_age_s=5.0)
    assert view.is_expired(now=0.0)
    view.update(scheduler_pb.ListWorkersResponse(), now=100.0)
    assert view.is_stale(now=101.5) and not view.is_expired(now=104.0)
    assert view.is_expired(now=105.5)
    assert RoleView(ttl_s=2.0).max_age_s == MAX_AGE_TTLS * 2.0
    with pytest.raises(ValueError):
        RoleView(ttl_s=1.0, max_age_s=0.5)
