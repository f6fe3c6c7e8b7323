"""Prefill retries, the P/D path and the served models, against in-memory fakes (the encoding
step: test_route_encoding.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epd.common.errors import NotFound, Unavailable
from epd.common.roles import Role
from epd.server.route.encoding import EncodeStage
from epd.server.route.hops import EngineCall, Piece, stream_tokens
from epd.server.route.media import RouteImage
from epd.server.route.request import Deadline
from epd.server.route.router import Router
from epd.server.route.topology import plan_for
from epd.v1 import generation_pb2, multimodal_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, generate, text_router


def stage_of(num_images: int) -> EncodeStage:
    items = [multimodal_pb2.MediaItem(mm_hash=f"h{i}", data=b"x") for i in range(num_images)]
    return EncodeStage("req", "tiny", items, num_tokens=[4] * num_images)


GRID = multimodal_pb2.ImageGrid(t=1, h=4, w=4)


def engine_pieces(router: Router, call: EngineCall, stage: EncodeStage) -> AsyncIterator[Piece]:
    """The router's engine pieces for ``stage``'s images, each of grid ``GRID``."""
    images = [RouteImage(item, None, GRID, 4) for item in stage.items]  # type: ignore[arg-type]
    return router._engine_pieces(call, stage, images)


def engine_call(live_roles: frozenset[int], num_images: int = 0) -> EngineCall:
    """A call of model ``tiny`` with a two-token prompt (``num_images`` images planned)."""
    return EngineCall(
        "req",
        "tiny",
        generation_pb2.Prompt(token_ids=[1, 2]),
        generation_pb2.SamplingParams(),
        [],
        plan_for(live_roles, num_images),
        Deadline(30),
    )  # type: ignore[arg-type]


async def test_prefill_failing_before_the_first_token_is_retried_elsewhere() -> None:
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    peers = FakePeers(scheduler, engines={"pd0": FakeEngine(error=Unavailable("down"))})
    released: list[bool] = []

    async def on_prefilled() -> None:
        released.append(True)

    pieces = [
        p
        async for p in stream_tokens(
            peers, engine_call(frozenset({Role.PREFILL_DECODE})), on_prefilled
        )
    ]  # type: ignore[arg-type]
    assert [t for p in pieces for t in p.token_ids] == [7, 8, 9]
    assert pieces[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    chooses = [r for name, r in scheduler.calls if name == "ChoosePrefill"]
    assert list(chooses[1].exclude_worker_ids) == ["pd0"]
    await peers.background.settle()
    assert released == [True]


@pytest.mark.parametrize(
    "roles", [frozenset({Role.PREFILL_DECODE}), frozenset({Role.PREFILL, Role.DECODE})]
)
async def test_the_first_token_does_not_wait_for_the_release(roles: frozenset[int]) -> None:
    scheduler = FakeScheduler(
        prefills=[("p0", Role.PREFILL if Role.DECODE in roles else Role.PREFILL_DECODE)]
    )
    peers = FakePeers(scheduler, engines={"p0": FakeEngine(), "dec0": FakeEngine()})
    may_release, released = asyncio.Event(), asyncio.Event()

    async def on_prefilled() -> None:
        await may_release.wait()
        released.set()

    stream = stream_tokens(peers, engine_call(roles), on_prefilled)  # type: ignore[arg-type]
    first = await asyncio.wait_for(anext(stream), 5)
    assert first.token_ids == [7] and not released.is_set()
    may_release.set()
    assert [t async for p in stream for t in p.token_ids] == [8, 9]
    await peers.background.settle()
    assert released.is_set()


async def test_failure_after_the_first_token_ends_the_stream_without_resumptions() -> None:
    peers = FakePeers(
        FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)]),
        engines={"pd0": FakeEngine(error=Unavailable("down"), num_before_error=1)},
    )
    received = []
    call = engine_call(frozenset({Role.PREFILL_DECODE}))
    with pytest.raises(Unavailable):
        async for piece in stream_tokens(peers, call, _nothing, max_resumptions=0):  # type: ignore[arg-type]
            received.extend(piece.token_ids)
    assert received == [7]
    assert "pd1" not in peers.engines


async def test_a_prefill_worker_hands_off_to_a_decode_worker() -> None:
    scheduler = FakeScheduler(prefills=[("p0", Role.PREFILL)])
    peers = FakePeers(scheduler, engines={"p0": FakeEngine(), "dec0": FakeEngine()})
    pieces = [
        p
        async for p in stream_tokens(
            peers, engine_call(frozenset({Role.PREFILL, Role.DECODE})), _nothing
        )
    ]  # type: ignore[arg-type]
    assert [t for p in pieces for t in p.token_ids] == [7, 8, 9]
    assert [name for name, _ in peers.engines["p0"].calls] == ["Prefill"]
    (decode,) = peers.engines["dec0"].calls
    assert decode[0] == "Decode" and decode[1].first_token_id == 7
    name, place = scheduler.calls[0]
    assert name == "Place", "one call names the prefill and decode workers"
    assert list(place.prefill_roles) == [
        scheduler_pb.WORKER_ROLE_PREFILL_DECODE,
        scheduler_pb.WORKER_ROLE_PREFILL,
        scheduler_pb.WORKER_ROLE_ENCODE_PREFILL,
    ]
    assert [name for name, _ in scheduler.calls].count("Place") == 1


def failing_then_held(scheduler: FakeScheduler, held: asyncio.Event) -> FakePeers:
    """Peers whose first prefill worker fails before the first token and whose second holds
    its prefill until ``held`` is set."""
    engines = {
        "p0": FakeEngine(error=Unavailable("gone")),
        "p1": FakeEngine(hold=held),
        "dec0": FakeEngine(),
    }
    return FakePeers(scheduler, engines=engines)


async def test_a_retry_s_decode_worker_is_chosen_while_its_prompt_is_prefilled() -> None:
    """The first attempt's decode worker comes with its placement; a retry's is chosen beside
    its prefill (off the path to the first token)."""
    scheduler = FakeScheduler(prefills=[("p0", Role.PREFILL), ("p1", Role.PREFILL)])
    chosen = asyncio.Event()
    peers = failing_then_held(scheduler, chosen)
    choose_decode = scheduler.ChooseDecode

    async def once_prefill_started(request: object, timeout: float | None = None) -> object:
        if not peers.engines["p0"].calls:
            return await choose_decode(request, timeout)  # NOTE: the placement's
        while not peers.engines["p1"].calls:
            await asyncio.sleep(0.001)
        reply = await choose_decode(request, timeout)
        chosen.set()
        return reply

    scheduler.ChooseDecode = once_prefill_started  # type: ignore[method-assign]
    stream = stream_tokens(peers, engine_call(frozenset({Role.PREFILL, Role.DECODE})), _nothing)  # type: ignore[arg-type]
    assert (await asyncio.wait_for(anext(stream), 5)).token_ids == [7]
    assert [t async for p in stream for t in p.token_ids] == [8, 9]
    names = [name for name, _ in scheduler.calls]
    assert names[0] == "Place" and names[-2:] == ["ChoosePrefill", "ChooseDecode"], names


async def test_no_decode_worker_fails_before_any_prefill_and_cancels_a_retry_s() -> None:
    scheduler = FakeScheduler(prefills=[("p0", Role.PREFILL)], decoders=[])
    peers = FakePeers(scheduler, engines={"p0": FakeEngine()})
    with pytest.raises(Unavailable) as caught:
        await anext(stream_tokens(peers, engine_call(frozenset({Role.PREFILL})), _nothing))  # type: ignore[arg-type]
    assert caught.value.reason == "NO_DECODE_WORKER"
    assert not peers.engines["p0"].calls, "placed without a decode worker: nothing prefilled"

    scheduler = FakeScheduler(prefills=[("p0", Role.PREFILL), ("p1", Role.PREFILL)])
    peers = failing_then_held(scheduler, asyncio.Event())
    calls = 0
    choose_decode = scheduler.ChooseDecode

    async def gone_after_the_first(request: object, timeout: float | None = None) -> object:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise Unavailable("no decode worker", reason="NO_DECODE_WORKER")
        return await choose_decode(request, timeout)

    scheduler.ChooseDecode = gone_after_the_first  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        await asyncio.wait_for(
            anext(
                stream_tokens(peers, engine_call(frozenset({Role.PREFILL, Role.DECODE})), _nothing)
            ),
            5,
        )  # type: ignore[arg-type]
    assert [name for name, _ in peers.engines["p1"].calls] == ["Prefill", "Prefill cancelled"]
    assert not peers.engines["dec0"].calls


async def _nothing() -> None:
    return None


async def test_an_unknown_model_is_not_found_and_names_the_served_models() -> None:
    peers = FakePeers()
    with pytest.raises(NotFound) as caught:
        await generate(text_router(peers), "x")
    assert caught.value.reason == "MODEL_NOT_FOUND"
    assert caught.value.message == "model 'x' is not served here; served models: tiny"
    assert [name for name, _ in peers.scheduler.calls] == ["ListWorkers"]


async def test_the_name_of_an_unknown_model_is_shortened_in_the_error() -> None:
    with pytest.raises(NotFound) as caught:
        await generate(text_router(FakePeers()), "x" * 100_000)
    assert len(caught.value.message) < 300
    assert all(len(value) < 300 for value in caught.value.metadata.values())


async def test_a_model_whose_workers_are_all_draining_is_unavailable_not_unknown() -> None:
    peers = FakePeers(FakeScheduler(prefills=[]))  # NOTE: ChoosePrefill finds no live worker
    list_workers = peers.scheduler.ListWorkers

    async def all_draining(request: Any, timeout: float | None = None) -> Any:
        listing = await list_workers(request, timeout)
        for worker in listing.workers:
            worker.info.model = "big"
            worker.state = scheduler_pb.WORKER_STATE_DRAINING
        return listing

    peers.scheduler.ListWorkers = all_draining  # type: ignore[method-assign]
    with pytest.raises(Unavailable) as caught:
        await generate(text_router(peers), "big")
    assert caught.value.reason == "NO_WORKER"


async def test_the_route_s_own_model_before_any_worker_registered_is_unavailable() -> None:
    peers = FakePeers(FakeScheduler(encoders=[], prefills=[], decoders=[]))
    worker = text_router(peers)
    for model in ("", "tiny"):
        with pytest.raises(Unavailable):
            await generate(worker, model)
    with pytest.raises(NotFound) as caught:
        await generate(worker, "x")
    assert caught.value.message == "model 'x' is not served here; served models: tiny"


async def test_a_known_model_answers() -> None:
    chunks = await generate(text_router(FakePeers()), "tiny")
    assert [token for chunk in chunks for token in chunk.token_ids] == [7, 8, 9]
