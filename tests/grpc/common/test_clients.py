"""The route's clients (``common.clients``): every failed call raises the peer's ``EpdError``,
never ``grpc.aio.AioRpcError``; a streamed call reads on where its last iteration stopped and
can be cancelled once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from epd.common import errors
from epd.common.channels import create_channel
from epd.common.clients import EncoderClient, SchedulerClient
from epd.common.server import ServerOptions, build_server
from epd.launch.free_ports import free_port
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import multimodal_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding


@pytest.fixture
async def encoder() -> AsyncIterator[tuple[ScriptedEncodeService, str]]:
    servicer = ScriptedEncodeService()
    server, port = await build_server([encode_binding(servicer)], ServerOptions())
    yield servicer, f"127.0.0.1:{port}"
    await server.drain_and_stop(0)


def encode_request(*hashes: str) -> encode_pb.EncodeRequest:
    items = [multimodal_pb2.MediaItem(mm_hash=h, url="data:,") for h in hashes]
    return encode_pb.EncodeRequest(items=items)


async def test_answers_and_a_streamed_failure_come_as_the_peers_own(encoder) -> None:
    servicer, endpoint = encoder
    servicer.encode_error = errors.InvalidArgument("second image is broken", reason="BAD_IMAGE")
    async with create_channel(endpoint) as channel:
        client = EncoderClient(channel, endpoint)
        reply = await client.Release(encode_pb.ReleaseRequest(lease_ids=["x", "y"]), timeout=5)
        received = []
        with pytest.raises(errors.InvalidArgument) as caught:
            async for response in client.Encode(encode_request("a", "b"), timeout=5):
                received.append(response.mm_hash)
    assert reply.num_released == 2
    assert received == ["a"] and caught.value.reason == "BAD_IMAGE"


async def test_iterating_again_reads_on_where_the_last_iteration_stopped(encoder) -> None:
    _, endpoint = encoder
    async with create_channel(endpoint) as channel:
        responses = EncoderClient(channel, endpoint).Encode(encode_request("a", "b", "c"))
        async for response in responses:
            first = response.mm_hash
            break
        rest = [response.mm_hash async for response in responses]
        assert [r async for r in responses] == []
    assert (first, rest) == ("a", ["b", "c"])


async def test_cancel_ends_the_call_on_the_server_once(encoder) -> None:
    servicer, endpoint = encoder
    servicer.item_delay_s = 0.2
    async with create_channel(endpoint) as channel:
        responses = EncoderClient(channel, endpoint).Encode(encode_request("a", "b", "c"))
        async for _ in responses:
            break
        assert responses.cancel()
        assert not responses.cancel()
        for _ in range(100):
            if servicer.encode_exits:
                break
            await asyncio.sleep(0.02)
    assert servicer.encode_exits == ["CancelledError"]


async def test_an_unreachable_worker_is_named_and_the_scheduler_keeps_the_code() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    async with create_channel(endpoint) as channel:
        with pytest.raises(errors.Unavailable) as worker:
            await EncoderClient(channel, endpoint).Release(encode_pb.ReleaseRequest(), timeout=5)
        with pytest.raises(errors.Unavailable) as streamed:
            async for _ in EncoderClient(channel, endpoint).Encode(encode_request("a"), timeout=5):
                pass
        with pytest.raises(errors.Unavailable) as scheduler:
            await SchedulerClient(channel).Place(scheduler_pb.PlaceRequest(), timeout=5)
    assert worker.value.reason == streamed.value.reason == "PEER_UNREACHABLE"
    assert worker.value.metadata == {"endpoint": endpoint}
    assert scheduler.value.reason == "UNAVAILABLE"


async def test_a_traced_call_reads_on_and_fails_alike(encoder, spans) -> None:
    servicer, endpoint = encoder
    servicer.encode_error = errors.InvalidArgument("second image is broken", reason="BAD_IMAGE")
    async with create_channel(endpoint) as channel:  # NOTE: with the tracing interceptors
        responses = EncoderClient(channel, endpoint).Encode(encode_request("a", "b"))
        async for response in responses:
            first = response.mm_hash
            break
        with pytest.raises(errors.InvalidArgument) as caught:
            async for _ in responses:
                pass
    assert first == "a" and caught.value.reason == "BAD_IMAGE"
    assert any(span.name == "/epd.v1.EncodeService/Encode" for span in spans.get_finished_spans())
