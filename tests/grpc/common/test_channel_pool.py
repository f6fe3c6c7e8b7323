"""The route's channel pool reaches a peer restarted on the same address at once, not after
gRPC's reconnect backoff (a restarted decode worker was refused for seconds: CI, session 18)."""

from __future__ import annotations

import asyncio

import grpc

from epd.common.channels import ChannelPool
from epd.common.clients import HealthClient
from epd.common.server import EpdServer, ServerOptions, build_server
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding

TRANSIENT = grpc.ChannelConnectivity.TRANSIENT_FAILURE


async def start(port: int = 0) -> tuple[EpdServer, int]:
    server, bound = await build_server(
        [encode_binding(ScriptedEncodeService())], ServerOptions(port=port)
    )
    await server.mark_serving()
    return server, bound


async def test_a_peer_restarted_on_the_same_port_is_reached_by_the_next_call() -> None:
    server, port = await start()
    endpoint = f"127.0.0.1:{port}"
    pool = ChannelPool()
    try:
        assert await pool.client(endpoint, HealthClient).is_serving(timeout=5)
        await server.drain_and_stop(0)
        for _ in range(4):  # NOTE: each refused connect lengthens gRPC's backoff (1 s, 1.6 s, ..)
            assert not await pool.client(endpoint, HealthClient).is_serving(timeout=5)
            await asyncio.sleep(0.3)
        server, _ = await start(port)
        assert await pool.client(endpoint, HealthClient).is_serving(timeout=5)
    finally:
        await pool.close()
        await server.drain_and_stop(0)


async def test_a_healthy_channel_and_its_clients_are_kept() -> None:
    server, port = await start()
    endpoint = f"127.0.0.1:{port}"
    pool = ChannelPool()
    try:
        client = pool.client(endpoint, HealthClient)
        assert await client.is_serving(timeout=5)
        assert pool.client(endpoint, HealthClient) is client
        assert pool.get(endpoint) is pool.get(endpoint)
    finally:
        await pool.close()
        await server.drain_and_stop(0)


async def test_a_call_in_flight_on_a_replaced_channel_finishes() -> None:
    """Closing a channel cancels its calls, and a cancelled call raises CancelledError in its
    caller (it cut the route's HTTP streams): a replaced channel closes only once they end."""
    servicer = ScriptedEncodeService()
    servicer.item_delay_s = 0.5
    server, port = await build_server([encode_binding(servicer)], ServerOptions())
    await server.mark_serving()
    endpoint = f"127.0.0.1:{port}"
    pool = ChannelPool()
    try:
        channel = pool.get(endpoint)
        request = encode_pb.EncodeRequest(
            items=[multimodal_pb2.MediaItem(mm_hash=str(i), url="data:,") for i in range(2)]
        )
        call = encode_grpc.EncodeServiceStub(channel).Encode(request)
        first = await call.read()
        channel.get_state = lambda try_to_connect=False: TRANSIENT  # type: ignore[method-assign]
        assert pool.get(endpoint) is not channel
        second = await call.read()
        assert grpc.aio.EOF not in (first, second)
        assert await call.read() is grpc.aio.EOF
    finally:
        await pool.close()
        await server.drain_and_stop(0)
