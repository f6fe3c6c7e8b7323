"""The engine's response stream behind the route's pieces is cancelled however the pieces end:
read to the end, failed, or closed early by the route's caller (the engine aborts the request)."""

from __future__ import annotations

import asyncio

import pytest

from epd.common.errors import InvalidArgument
from epd.common.roles import Role
from epd.server.route.hops import stream_tokens
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers
from tests.unit.route.test_resumption import E_P_D, E_PD, _nothing, call_of

TOPOLOGIES = [
    (E_PD, FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE)]), "pd0"),
    (E_P_D, FakeScheduler(prefills=[("p0", Role.PREFILL)], decoders=["dec0"]), "dec0"),
]


def peers_of(scheduler: FakeScheduler, streaming: str, engine: FakeEngine) -> FakePeers:
    return FakePeers(scheduler, engines={streaming: engine, "p0": FakeEngine()})


@pytest.mark.parametrize(("live_roles", "scheduler", "streaming"), TOPOLOGIES)
async def test_closing_the_pieces_early_cancels_the_engine_stream(
    live_roles: frozenset[Role], scheduler: FakeScheduler, streaming: str
) -> None:
    engine = FakeEngine(tokens=[7, 8, 9, 10])
    pieces = stream_tokens(
        peers_of(scheduler, streaming, engine),  # type: ignore[arg-type]
        call_of(live_roles),
        _nothing,
    )
    while not engine.streams or not engine.streams[-1].num_yielded:
        await anext(pieces)
    assert not engine.streams[-1].is_cancelled
    await pieces.aclose()
    for _ in range(10):  # NOTE: the inner generators close as the loop finalizes them
        await asyncio.sleep(0)
    assert engine.streams[-1].is_cancelled


@pytest.mark.parametrize(("live_roles", "scheduler", "streaming"), TOPOLOGIES)
async def test_a_stream_read_to_its_end_or_failed_is_cancelled_too(
    live_roles: frozenset[Role], scheduler: FakeScheduler, streaming: str
) -> None:
    engine = FakeEngine(tokens=[7, 8, 9])
    peers = peers_of(scheduler, streaming, engine)
    assert [p async for p in stream_tokens(peers, call_of(live_roles), _nothing)]  # type: ignore[arg-type]
    assert engine.streams[-1].is_cancelled
    failing = FakeEngine(error=InvalidArgument("bad"), num_before_error=1)
    peers = peers_of(scheduler, streaming, failing)
    with pytest.raises(InvalidArgument):
        async for _ in stream_tokens(peers, call_of(live_roles), _nothing):  # type: ignore[arg-type]
            pass
    assert failing.streams[-1].is_cancelled
