"""The route's channel pool reaches a peer restarted on the same address at once, not after
gRPC's reconnect backoff (a restarted decode worker was refused for seconds: CI, session 18)."""

from __future__ import annotations

import asyncio

from epd.common.channels import ChannelPool
from epd.common.clients import HealthClient
from epd.common.server import EpdServer, ServerOptions, build_server
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding


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
