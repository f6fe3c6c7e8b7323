"""EncodeWorker with decoded pixels beside the source: used, without decoding or hashing, when
readable and tagged with the item's mm_hash by whoever shared them, before and after they are
read; the source otherwise."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.vision import Prepared
from epd.server.encode.worker import EncodedItem, EncodeWorker, MediaSource
from epd.server.media.hashing import mm_hash
from epd.server.media.image_settings import ImageSettings
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2
from tests.unit.encode.test_encode_worker import FakeTower, new_worker
from tests.unit.media.images import encode, noise


@pytest.fixture
async def worker() -> AsyncIterator[EncodeWorker]:
    batcher: DynamicBatcher[Prepared, tuple[torch.Tensor, tuple[int, int, int]]] = DynamicBatcher(
        FakeTower(), max_items=8, max_wait_s=0.0
    )
    plane = DataPlane("host-a", kinds=("shm", "inline"))
    worker = new_worker(batcher, plane)
    yield worker
    await worker.close()
    assert plane.held() == [] and worker.num_in_flight == 0
    plane.close()


@pytest.fixture
def holder() -> Iterator[DataPlane]:
    """The route's plane: holds the pixels on the encoder's host."""
    plane = DataPlane("host-a", kinds=("shm",))
    yield plane
    plane.close()


def hash_of(image: Image.Image) -> str:
    return mm_hash(np.asarray(image), model_id="m", processor_fingerprint="p")


def put_pixels(
    plane: DataPlane, image: Image.Image, tag: Image.Image | None = None
) -> tensor_pb2.TensorRef:
    """``image``'s pixels shared as the route shares them: tagged with the mm_hash of ``tag``
    (default: ``image``'s own)."""
    pixels = torch.from_numpy(np.array(image))
    content_tag = bytes.fromhex(hash_of(image if tag is None else tag))
    return plane.put(pixels, plane.host_id, content_tag=content_tag)


def first_pixel_sum(image: Image.Image) -> float:
    return float(sum(image.getpixel((0, 0))))


async def encoded(worker: EncodeWorker, source: MediaSource) -> EncodedItem:
    (item,) = [item async for item in worker.encode([source], consumer_host_id="host-a")]
    worker.plane.release([item.embeddings.lease_id])
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
        flat = torch.from_numpy(np.array(image).reshape(-1))
        ref = holder.put(flat, holder.host_id, content_tag=bytes.fromhex(hash_of(image)))
    item = await encoded(worker, MediaSource(hash_of(image), data=encode(image), pixels=ref))
    assert item.mm_hash == hash_of(image)
    assert embedding(worker, item) == first_pixel_sum(image)
    if case == "foreign host":
        elsewhere.close()


async def test_pixels_not_tagged_as_the_item_are_never_trusted(worker, holder) -> None:
    """Pixels shared untagged, or tagged as another image, are not taken for the item's image,
    even when they are that image: only their producer's tag names them."""
    image = noise(seed=6)
    untagged = holder.put(torch.from_numpy(np.array(image)), holder.host_id)
    as_other = put_pixels(holder, image, tag=noise(seed=7))
    for ref in (untagged, as_other):
        with pytest.raises(InvalidArgument) as caught:
            await encoded(worker, MediaSource(hash_of(image), data=b"junk", pixels=ref))
        assert caught.value.reason == "BAD_IMAGE"  # NOTE: the source was loaded instead


async def test_pixels_released_while_being_read_are_not_encoded(worker, holder) -> None:
    """The tag is checked again once the pixels are read: a lease released meanwhile (its
    segment may hold another image by then) sends the worker to the source."""
    image = noise(seed=8)
    ref = put_pixels(holder, image)
    prepare = worker.preparer.prepare_image

    def release_while_reading(pixels: torch.Tensor, settings: ImageSettings) -> Prepared:
        holder.release([ref.lease_id])
        return prepare(pixels, settings)

    worker.preparer.prepare_image = release_while_reading
    with pytest.raises(InvalidArgument) as caught:
        await encoded(worker, MediaSource(hash_of(image), data=b"junk", pixels=ref))
    assert caught.value.reason == "BAD_IMAGE"
    assert worker.cache.get(hash_of(image)) is None


@pytest.mark.parametrize("claimed", ["not-a-hash", "AB" * 16, "ab" * 17])
async def test_pixels_named_by_no_mm_hash_are_ignored_for_the_source(
    worker, holder, claimed: str
) -> None:
    """A caller's mm_hash of another form (any caller may send one) is no tag to look for: the
    source is loaded and the mm_hash checked against it, a usage error, never a crash."""
    image = noise(seed=9)
    ref = put_pixels(holder, image)
    with pytest.raises(InvalidArgument) as caught:
        await encoded(worker, MediaSource(claimed, data=encode(image), pixels=ref))
    assert caught.value.reason == "MM_HASH_MISMATCH"


async def test_shared_pixels_are_read_and_prepared_off_the_event_loop(worker, holder) -> None:
    """The route's pixels of an image worth a hand-off are read (segment mapped, stamp checked
    before and after) in the preparing pool with the preparing, not on the event loop, which
    serves every request of the encoder (on a GPU it is the encoder's serial part)."""
    image = noise(width=320, height=240, seed=10)
    ref = put_pixels(holder, image)
    read_on: list[tuple[str, str]] = []
    get, check = worker.plane.get, worker.plane.check

    def recording_get(*args: Any, **kwargs: Any) -> torch.Tensor:
        read_on.append(("get", threading.current_thread().name))
        return get(*args, **kwargs)

    def recording_check(*args: Any, **kwargs: Any) -> None:
        read_on.append(("check", threading.current_thread().name))
        check(*args, **kwargs)

    worker.plane.get = recording_get  # type: ignore[method-assign]
    worker.plane.check = recording_check  # type: ignore[method-assign]
    item = await encoded(worker, MediaSource(hash_of(image), data=b"junk", pixels=ref))
    assert item.mm_hash == hash_of(image) and not item.cache_hit
    assert [call for call, _ in read_on] == ["get", "check"]
    assert threading.main_thread().name not in [thread for _, thread in read_on]
