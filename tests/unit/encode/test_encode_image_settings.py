"""An image's pixel budget on an encoder (``MediaItem.image_settings``): it reaches the
processor, from the route's shared pixels or the image's source, and the image is named under it
(``hashing.under_settings`` of its content hash), so the same image under two budgets is encoded
twice and under one budget once; a hash sent without the budget does not match, and a floor
over the media pixel limit is a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import torch

from epd.common.errors import InvalidArgument
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.vision import Prepared
from epd.server.encode.worker import EncodeWorker, MediaSource
from epd.server.media.hashing import mm_hash, under_settings
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings
from epd.server.transfer.plane import DataPlane
from tests.unit.encode.test_encode_worker import FakeTower, fake_prepare, new_worker
from tests.unit.media.images import encode, noise

SMALL = ImageSettings(3136, 5000)
LARGE = ImageSettings(3136, 9000)


@pytest.fixture
async def parts() -> AsyncIterator[tuple[EncodeWorker, FakeTower, list[ImageSettings]]]:
    """A worker whose processor records the budget of each image it prepares."""
    tower = FakeTower()
    batcher: DynamicBatcher[Prepared, Any] = DynamicBatcher(tower, max_items=8, max_wait_s=0.0)
    plane = DataPlane("host-a", kinds=("shm", "inline"))
    worker = new_worker(batcher, plane)
    budgets: list[ImageSettings] = []

    def recording(pixels: torch.Tensor, settings: ImageSettings) -> Prepared:
        budgets.append(settings)
        return fake_prepare(pixels, settings)

    worker.preparer.prepare_image = recording
    yield worker, tower, budgets
    await worker.close()
    assert plane.held() == [] and worker.num_in_flight == 0
    plane.close()


async def encoded(worker: EncodeWorker, source: MediaSource) -> tuple[str, bool]:
    (item,) = [item async for item in worker.encode([source], consumer_host_id="host-a")]
    worker.plane.release([item.embeddings.lease_id])
    return item.mm_hash, item.cache_hit


async def test_one_image_under_two_budgets_is_encoded_twice_and_under_one_once(parts) -> None:
    worker, tower, budgets = parts
    image = noise(seed=11)
    content = mm_hash(np.asarray(image), model_id="m", processor_fingerprint="p")
    data = encode(image)
    order = (SMALL, LARGE, SMALL, NO_IMAGE_SETTINGS)
    answers = [await encoded(worker, MediaSource(data=data, image_settings=s)) for s in order]
    assert answers == [
        (under_settings(content, SMALL.key), False),
        (under_settings(content, LARGE.key), False),
        (under_settings(content, SMALL.key), True),
        (content, False),
    ]
    assert len(tower.calls) == 3
    assert budgets == [SMALL, LARGE, NO_IMAGE_SETTINGS]


async def test_the_routes_pixels_are_prepared_under_the_items_budget(parts) -> None:
    worker, tower, budgets = parts
    holder = DataPlane("host-a", kinds=("shm",))
    image = noise(seed=12)
    content = mm_hash(np.asarray(image), model_id="m", processor_fingerprint="p")
    name = under_settings(content, LARGE.key)
    pixels = torch.from_numpy(np.array(image))
    ref = holder.put(pixels, holder.host_id, content_tag=bytes.fromhex(name))
    try:
        source = MediaSource(name, data=b"junk", pixels=ref, image_settings=LARGE)
        assert await encoded(worker, source) == (name, False)
    finally:
        holder.release([ref.lease_id])
        holder.close()
    assert budgets == [LARGE] and tower.calls == [1]


async def test_a_hash_without_the_budget_does_not_match_the_image(parts) -> None:
    worker, _, budgets = parts
    image = noise(seed=13)
    content = mm_hash(np.asarray(image), model_id="m", processor_fingerprint="p")
    with pytest.raises(InvalidArgument) as caught:
        await encoded(worker, MediaSource(content, data=encode(image), image_settings=SMALL))
    assert caught.value.reason == "MM_HASH_MISMATCH"
    assert budgets == []


async def test_a_floor_over_the_media_pixel_limit_is_refused(parts) -> None:
    worker, _, budgets = parts
    huge = ImageSettings(min_pixels=worker.loader.policy.max_pixels + 1, max_pixels=10**9)
    with pytest.raises(InvalidArgument) as caught:
        await encoded(worker, MediaSource(data=encode(noise(seed=14)), image_settings=huge))
    assert caught.value.reason == "BAD_MEDIA_KWARGS"
    assert budgets == []
