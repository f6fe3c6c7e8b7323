"""Drain: holds keep a server serving until what it lent is taken (bounded by the grace), and a
stream still running when the grace ends fails with UNAVAILABLE, a code callers retry."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from epd.common import errors
from epd.common.channels import create_channel
from epd.common.server import EpdServer, ServerOptions, build_server
from epd.common.status import from_rpc_error
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding


async def start(servicer: ScriptedEncodeService, **options) -> tuple[EpdServer, str]:
    server, port = await build_server([encode_binding(servicer)], ServerOptions(**options))
    return server, f"127.0.0.1:{port}"


async def test_a_hold_keeps_the_server_serving_until_it_settles() -> None:
    servicer = ScriptedEncodeService()
    server, endpoint = await start(servicer, drain_grace_s=10.0)
    held = [True]
    server.add_drain_hold(lambda: not held[0])

    async def settle() -> None:
        held.clear()
        held.append(False)

    servicer.on_release = settle
    draining = asyncio.ensure_future(server.drain_and_stop())
    await asyncio.sleep(0.2)
    assert not draining.done()
    async with create_channel(endpoint) as channel:  # the consumer still reaches the server
        await encode_grpc.EncodeServiceStub(channel).Release(encode_pb.ReleaseRequest())
    await asyncio.wait_for(draining, 2.0)


async def test_a_hold_that_never_settles_ends_with_the_grace() -> None:
    server, _ = await start(ScriptedEncodeService())
    server.add_drain_hold(lambda: False)
    started = time.monotonic()
    await asyncio.wait_for(server.drain_and_stop(0.3), 5.0)
    assert 0.3 <= time.monotonic() - started < 2.0


async def test_a_stream_cut_by_the_grace_fails_unavailable() -> None:
    servicer = ScriptedEncodeService()
    servicer.item_delay_s = 0.1
    server, endpoint = await start(servicer)
    items = [multimodal_pb2.MediaItem(mm_hash=str(i), url="data:,") for i in range(100)]
    async with create_channel(endpoint) as channel:
        call = encode_grpc.EncodeServiceStub(channel).Encode(encode_pb.EncodeRequest(items=items))
        await call.read()
        draining = asyncio.ensure_future(server.drain_and_stop(0.3))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            while True:
                await call.read()
        await draining
    error = from_rpc_error(caught.value)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert isinstance(error, errors.Unavailable)
    # NOTE: the handler may be cut (cancelled, or its stream closed) after the server stopped
    for _ in range(100):
        if servicer.encode_exits:
            break
        await asyncio.sleep(0.02)
    assert servicer.encode_exits in (["CancelledError"], ["GeneratorExit"])  # cut, not finished


async def test_stop_now_ends_a_drain_waiting_for_its_holds() -> None:
    server, _ = await start(ScriptedEncodeService(), drain_grace_s=30.0)
    server.add_drain_hold(lambda: False)
    draining = asyncio.ensure_future(server.drain_and_stop())
    await asyncio.sleep(0.1)
    await server.stop_now()  # what a second SIGTERM does
    await asyncio.wait_for(draining, 2.0)
