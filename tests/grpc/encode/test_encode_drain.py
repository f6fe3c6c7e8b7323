"""A draining encoder refuses new work but keeps the embeddings it lent readable until their
consumer released them (or the grace ends), then frees everything."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.server.encode.app import EncodeApp, EncodeConfig, build_encode_server
from epd.server.transfer import shm
from epd.server.transfer.plane import DataPlane
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.encode.test_encode_service import png


async def encoded(app: EncodeApp, seed: int) -> pb.EncodeResponse:
    request = pb.EncodeRequest(
        items=[multimodal_pb2.MediaItem(data=png(seed))], consumer_host_id=app.worker.plane.host_id
    )
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        (response,) = [r async for r in pb_grpc.EncodeServiceStub(channel).Encode(request)]
    return response


def own_segments() -> list[str]:
    return [name for name in shm.list_segments() if name.startswith(shm.process_prefix())]


async def test_lent_embeddings_stay_readable_until_released(tiny_model_dir) -> None:
    app = await build_encode_server(EncodeConfig(tiny_model_dir, model_id="tiny"))
    response = await encoded(app, 1)
    stopping = asyncio.ensure_future(app.stop(grace=10.0))  # what SIGTERM does (epd encode)
    await asyncio.sleep(0.3)
    assert not stopping.done()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await encoded(app, 2)
    assert from_rpc_error(refused.value).reason == "DRAINING"
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    consumer = DataPlane(app.worker.plane.host_id)
    try:
        embeddings = consumer.get(response.embeddings, copy=True)
    finally:
        consumer.close()
    assert embeddings.numel() > 0
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        await pb_grpc.EncodeServiceStub(channel).Release(
            pb.ReleaseRequest(lease_ids=[response.embeddings.lease_id])
        )
    await asyncio.wait_for(stopping, 2.0)
    assert app.worker.plane.held() == [] and own_segments() == []


async def test_unreleased_embeddings_are_freed_when_the_grace_ends(tiny_model_dir) -> None:
    app = await build_encode_server(EncodeConfig(tiny_model_dir, model_id="tiny"))
    await encoded(app, 3)
    started = time.monotonic()
    await asyncio.wait_for(app.stop(grace=0.5), 5.0)
    assert time.monotonic() - started >= 0.5
    assert app.worker.plane.held() == [] and own_segments() == []
