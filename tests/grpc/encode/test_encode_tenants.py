"""An encoder keeps tenants apart: an item the route salted (``MediaItem.key_salt``) is looked
up, checked and cached under its salted mm_hash, also when the encoder hashes the source
itself (another host, no shared pixels), so one tenant's image is a miss for another."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.media.hashing import key_salt, salted
from epd.server.transfer.plane import DataPlane
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.encode.test_encode_service import png

ALICE, BOB = key_salt("alice", ""), key_salt("bob", "")


@pytest.fixture(scope="module")
async def app(tiny_model_dir: Path) -> AsyncIterator[Any]:
    encode_app = await build_encode_server(EncodeConfig(tiny_model_dir, model_id="tiny"))
    yield encode_app
    await encode_app.stop()


async def encode(app: Any, item: multimodal_pb2.MediaItem) -> pb.EncodeResponse:
    request = pb.EncodeRequest(items=[item], consumer_host_id=DataPlane().host_id)
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        stub = pb_grpc.EncodeServiceStub(channel)
        (response,) = [r async for r in stub.Encode(request)]
    await stub_release(app, response)
    return response


async def stub_release(app: Any, response: pb.EncodeResponse) -> None:
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        await pb_grpc.EncodeServiceStub(channel).Release(
            pb.ReleaseRequest(lease_ids=[response.embeddings.lease_id])
        )


def tenant_item(data: bytes, plain_hash: str, salt: str) -> multimodal_pb2.MediaItem:
    return multimodal_pb2.MediaItem(mm_hash=salted(plain_hash, salt), key_salt=salt, data=data)


async def test_two_tenants_miss_each_others_image_and_hit_their_own(app: Any) -> None:
    data = png(41)
    plain = await encode(app, multimodal_pb2.MediaItem(data=data))
    cache = app.worker.cache
    misses = cache.num_misses
    alice = await encode(app, tenant_item(data, plain.mm_hash, ALICE))
    assert not alice.cache_hit and alice.mm_hash == salted(plain.mm_hash, ALICE)
    bob = await encode(app, tenant_item(data, plain.mm_hash, BOB))
    assert not bob.cache_hit and bob.mm_hash == salted(plain.mm_hash, BOB)
    assert cache.num_misses == misses + 2
    again = await encode(app, tenant_item(data, plain.mm_hash, ALICE))
    assert again.cache_hit and again.mm_hash == alice.mm_hash
    assert {plain.mm_hash, alice.mm_hash, bob.mm_hash} <= set(cache.keys())


async def test_a_salted_hash_claimed_with_another_salt_is_refused(app: Any) -> None:
    data = png(42)
    plain = await encode(app, multimodal_pb2.MediaItem(data=data))
    claimed = multimodal_pb2.MediaItem(
        mm_hash=salted(plain.mm_hash, ALICE), key_salt=BOB, data=data
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await encode(app, claimed)
    assert from_rpc_error(refused.value).reason == "MM_HASH_MISMATCH"
