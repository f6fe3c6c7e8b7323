"""EncodeWorker with decoded pixels beside the source: used when readable and hashing to mm_hash,
the source otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
import torch
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import EmbeddingCache
from epd.server.encode.worker import EncodedItem, EncodeWorker, MediaSource
from epd.server.media.hashing import mm_hash
from epd.server.media.loader import MediaLoader
from epd.server.media.pixels import pixels_of
from epd.server.media.policy import MediaPolicy
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2
from tests.unit.encode.test_encode_worker import FakeTower
from tests.unit.media.images import encode, noise


@pytest.fixture
async def worker() -> AsyncIterator[EncodeWorker]:
    batcher: DynamicBatcher[Image.Image, tuple[torch.Tensor, tuple[int, int, int]]] = (
        DynamicBatcher(FakeTower(), max_items=8, max_wait_s=0.0)
    )
    plane = DataPlane("host-a", kinds=("shm", "inline"))
    loader = MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    worker = EncodeWorker(
        batcher, loader, plane, EmbeddingCache(1 << 20), worker_id="w", model_id="m"
    )
    yield worker
    await batcher.close()
    assert plane.held() == [] and worker.num_in_flight == 0
    plane.close()


@pytest.fixture
def holder() -> Iterator[DataPlane]:
    """The route's plane: holds the pixels on the encoder's host."""
    plane = DataPlane("host-a", kinds=("shm",))
    yield plane
    plane.close()


def hash_of(image: Image.Image) -> str:
    return mm_hash(image, model_id="m", processor_fingerprint="p")


def put_pixels(plane: DataPlane, image: Image.Image) -> tensor_pb2.TensorRef:
    pixels = pixels_of(image)
    assert pixels is not None
    return plane.put(torch.from_numpy(pixels), plane.host_id)


def first_pixel_sum(image: Image.Image) -> float:
    return float(sum(image.getpixel((0, 0))))


async def encoded(worker: EncodeWorker, source: MediaSource) -> EncodedItem:
    (item,) = [item async for item in worker.encode([source], consumer_host_id="host-a")]
    worker.release([item.embeddings.lease_id])
    return item


def embedding(worker: EncodeWorker, item: EncodedItem) -> float:
    cached = worker.cache.get(item.mm_hash)
    assert cached is not None
    return float(cached.embeddings[0, 0])


async def test_pixels_replace_a_source_that_would_not_decode(worker, holder) -> None:
    image = noise(seed=1)
    ref = put_pixels(holder, image)
    item = await encoded(worker, MediaSource(hash_of(image), data=b"junk", pixels=ref))
    assert item.mm_hash == hash_of(image) and not item.cache_hit
    assert embedding(worker, item) == first_pixel_sum(image)


async def test_pixels_of_another_image_are_ignored_for_the_source(worker, holder) -> None:
    image, other = noise(seed=2), noise(seed=3)
    ref = put_pixels(holder, other)
    item = await encoded(worker, MediaSource(hash_of(image), data=encode(image), pixels=ref))
    assert item.mm_hash == hash_of(image)
    assert embedding(worker, item) == first_pixel_sum(image)
    assert worker.cache.get(hash_of(other)) is None  # NOTE: nothing cached under a lie
    with pytest.raises(InvalidArgument) as caught:  # NOTE: and no pixels means the source
        await encoded(worker, MediaSource(hash_of(noise(seed=4)), data=b"junk", pixels=ref))
    assert caught.value.reason == "BAD_IMAGE"


@pytest.mark.parametrize("case", ["foreign host", "released", "bad shape"])
async def test_unreadable_pixels_fall_back_to_the_source(worker, holder, case) -> None:
    image = noise(seed=5)
    if case == "foreign host":
        elsewhere = DataPlane("host-b", kinds=("shm",))
        ref = put_pixels(elsewhere, image)
    elif case == "released":
        ref = put_pixels(holder, image)
        holder.release([ref.lease_id])
    else:
        flat = torch.from_numpy(np.ascontiguousarray(pixels_of(image)).reshape(-1))
        ref = holder.put(flat, holder.host_id)
    item = await encoded(worker, MediaSource(hash_of(image), data=encode(image), pixels=ref))
    assert item.mm_hash == hash_of(image)
    assert embedding(worker, item) == first_pixel_sum(image)
    if case == "foreign host":
        elsewhere.close()
