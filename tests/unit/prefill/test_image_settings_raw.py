"""An encode_prefill worker's raw picture under a pixel budget (``MediaItem.image_settings``):
loaded from its source it is named under its budget (then salted for a tenant), as the route
named it, and the engine image carries the budget for vLLM's processor; a budget that is not
canonical settings, or whose floor is over the media pixel limit, is a 400."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.media.hashing import key_salt, salted, under_settings
from epd.server.media.image_settings import ImageSettings
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.transfer.plane import DataPlane
from epd.server.worker.images import ImageResolver
from epd.v1 import multimodal_pb2
from tests.unit.prefill.test_shared_pixels import PIXELS, png

SMALL = ImageSettings(3136, 5000)


async def resolved(item: multimodal_pb2.MediaItem) -> EngineImage:
    loader = MediaLoader(MediaPolicy(max_pixels=10**6), model_id="tiny", processor_fingerprint="x")
    worker = DataPlane("host-b", kinds=("shm",))
    try:
        (image,) = await ImageResolver(worker, loader).resolve(
            [multimodal_pb2.ImageInput(mm_hash=item.mm_hash, media=item)]
        )
    finally:
        worker.close()
    return image


async def test_a_budgeted_picture_is_named_under_its_budget_and_carries_it() -> None:
    source = png(PIXELS)
    plain = await resolved(multimodal_pb2.MediaItem(data=source))
    item = multimodal_pb2.MediaItem(data=source, image_settings=SMALL.key)
    budgeted = await resolved(item)
    assert budgeted.mm_hash == under_settings(plain.mm_hash, SMALL.key) != plain.mm_hash
    assert (budgeted.image_settings, plain.image_settings) == (SMALL, ImageSettings())
    salt = key_salt("tenant", "")
    item.key_salt = salt
    assert (await resolved(item)).mm_hash == salted(budgeted.mm_hash, salt)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [('{"max_pixels": 0}', "BAD_MEDIA_ITEM"), (ImageSettings(10**6 + 1).key, "BAD_MEDIA_KWARGS")],
)
async def test_a_bad_budget_is_refused(settings: str, reason: str) -> None:
    item = multimodal_pb2.MediaItem(data=png(PIXELS), image_settings=settings)
    with pytest.raises(InvalidArgument) as caught:
        await resolved(item)
    assert caught.value.reason == reason
