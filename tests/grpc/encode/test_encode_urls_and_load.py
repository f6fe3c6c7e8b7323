"""EncodeService with URLs (slow server, redirects to private hosts) and under concurrent load,
ending with a leak check: no lease held, no shared-memory segment left, no task left running."""

from __future__ import annotations

import asyncio
import base64
import io
import ipaddress

import grpc
import numpy as np
import pytest
from PIL import Image

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.server.encode.app import EncodeApp, EncodeConfig, build_encode_server
from epd.server.media import fetch
from epd.server.media.policy import MediaPolicy
from epd.server.transfer import shm
from epd.server.transfer.plane import DataPlane
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.media.web import image_server
from tests.unit.media.images import scan_bomb


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (56, 84, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def own_segments() -> list[str]:
    return [name for name in shm.list_segments() if name.startswith(shm.process_prefix())]


async def start(model_dir, policy: MediaPolicy, **config) -> tuple[EncodeApp, grpc.aio.Channel]:
    app = await build_encode_server(
        EncodeConfig(model_dir, model_id="tiny", media=policy, **config)
    )
    return app, create_channel(f"127.0.0.1:{app.port}")


async def reason_of(stub: pb_grpc.EncodeServiceStub, url: str) -> str:
    request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(url=url)])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stub.Encode(request)]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return from_rpc_error(caught.value).reason


async def test_urls_timeouts_and_redirects(tiny_model_dir, monkeypatch) -> None:
    policy = MediaPolicy(allow_private_networks=True, fetch_timeout_s=0.5, max_bytes=1 << 20)
    app, channel = await start(tiny_model_dir, policy)
    guarded, guarded_channel = await start(tiny_model_dir, MediaPolicy(fetch_timeout_s=2))
    try:
        async with image_server(png(1)) as server:
            stub = pb_grpc.EncodeServiceStub(channel)
            request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(url=f"{server}/image.png")])
            (response,) = [r async for r in stub.Encode(request)]
            assert response.embeddings.byte_size > 0
            app.worker.plane.release([response.embeddings.lease_id])
            assert await reason_of(stub, f"{server}/slow") == "FETCH_TIMEOUT"
            assert await reason_of(stub, f"{server}/huge") == "IMAGE_TOO_LARGE"
            assert await reason_of(stub, f"{server}/image\t.png") == "BAD_URL"
            bomb = "data:image/jpeg;base64," + base64.b64encode(scan_bomb(512, 500)).decode()
            assert await reason_of(stub, bomb) == "IMAGE_TOO_COMPLEX"
            # NOTE: 127.0.0.1 plays a public host here; 127.0.0.2 stays private.
            trusted = ipaddress.ip_address("127.0.0.1")
            monkeypatch.setattr(fetch, "is_public", lambda address: address == trusted)
            guarded_stub = pb_grpc.EncodeServiceStub(guarded_channel)
            port = server.rsplit(":", 1)[1]
            hop = f"{server}/redirect?to=http://127.0.0.2:{port}/image.png"
            assert await reason_of(guarded_stub, hop) == "PRIVATE_ADDRESS"
            assert await reason_of(guarded_stub, f"{server}/redirect?to=file:///etc/passwd") == (
                "UNSUPPORTED_SCHEME"
            )
    finally:
        for each, each_channel in ((app, channel), (guarded, guarded_channel)):
            await each_channel.close()
            await each.stop()
    assert app.worker.plane.held() == [] and guarded.worker.plane.held() == []


async def test_concurrent_load_leaves_nothing_behind(tiny_model_dir) -> None:
    segments_before = set(own_segments())
    tasks_before = asyncio.all_tasks()
    app, channel = await start(
        tiny_model_dir, MediaPolicy(), max_batch_size=4, max_batch_wait_ms=20, transfer_kind="shm"
    )
    stub = pb_grpc.EncodeServiceStub(channel)
    consumer = DataPlane(app.worker.plane.host_id)
    images = [png(10 + i) for i in range(6)]

    async def one_request(index: int) -> tuple[int, set[str]]:
        items = [multimodal_pb2.MediaItem(data=images[(index + k) % 6]) for k in range(3)]
        responses = [r async for r in stub.Encode(pb.EncodeRequest(items=items))]
        rows = sum(consumer.get(r.embeddings).shape[0] for r in responses)
        await stub.Release(pb.ReleaseRequest(lease_ids=[r.embeddings.lease_id for r in responses]))
        return rows, {r.mm_hash for r in responses}

    results = await asyncio.gather(*(one_request(i) for i in range(16)))
    assert {rows for rows, _ in results} == {3 * 6}  # 84x56 -> grid (1, 4, 6) -> 6 rows each
    assert len(set().union(*(hashes for _, hashes in results))) == 6
    assert app.worker.batcher.stats.num_items == 6  # each distinct image encoded once
    assert app.worker.plane.held() == [] and app.worker.num_in_flight == 0
    consumer.close()
    await channel.close()
    await app.stop()
    assert set(own_segments()) <= segments_before
    await asyncio.sleep(0)
    leftover = {t for t in asyncio.all_tasks() - tasks_before if not t.done()}
    assert leftover <= {asyncio.current_task()}, leftover
