"""An encode_prefill worker takes an image's decoded pixels from the route only where the route's
content tag binds them to the image's mm_hash: then it neither fetches, decodes nor hashes it;
pixels tagged as anything else, released, or not readable here are ignored and the source is
loaded, as if they were absent."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from PIL import Image

from epd.server.media.hashing import embeddings_tag, pixels_tag
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.transfer.plane import DataPlane
from epd.server.worker.images import ImageResolver
from epd.v1 import multimodal_pb2

PIXELS = np.random.default_rng(7).integers(0, 256, (24, 32, 3), dtype=np.uint8)
OTHER = np.zeros((24, 32, 3), dtype=np.uint8)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def route() -> Iterator[DataPlane]:
    plane = DataPlane("host-a", kinds=("shm",))
    yield plane
    plane.close()


@pytest.fixture
def loader() -> MediaLoader:
    return MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="x")


async def resolve(
    loader: MediaLoader, item: multimodal_pb2.MediaItem, host_id: str = "host-a"
) -> tuple[np.ndarray, str]:
    """The picture an encode_prefill worker on ``host_id`` makes of ``item``, and its name."""
    worker = DataPlane(host_id, kinds=("shm",))
    try:
        (image,) = await ImageResolver(worker, loader).resolve(
            [multimodal_pb2.ImageInput(mm_hash=item.mm_hash, media=item)]
        )
    finally:
        worker.close()
    assert image.image is not None
    return np.asarray(image.image), image.mm_hash


async def test_the_route_s_tagged_pixels_are_taken_as_the_image(
    route: DataPlane, loader: MediaLoader
) -> None:
    hasher = MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="x")
    mm_hash = (await hasher.load(data=png(PIXELS))).mm_hash
    ref = route.put(torch.from_numpy(PIXELS), "host-a", content_tag=pixels_tag(mm_hash))
    item = multimodal_pb2.MediaItem(data=b"not an image", mm_hash=mm_hash, pixels=ref)
    pixels, name = await resolve(loader, item)
    assert np.array_equal(pixels, PIXELS) and name == mm_hash
    assert loader.num_decoded == 0, "neither fetched, decoded nor hashed"
    route.release([ref.lease_id])


@pytest.mark.parametrize("case", ["other tag", "embeddings tag", "released", "other host"])
async def test_pixels_not_bound_to_the_image_here_are_ignored_for_the_source(
    route: DataPlane, loader: MediaLoader, case: str
) -> None:
    source = png(PIXELS)
    mm_hash = (await loader.load(data=source)).mm_hash
    other_hash = (await loader.load(data=png(OTHER))).mm_hash
    tag = {
        "other tag": pixels_tag(other_hash),
        "embeddings tag": embeddings_tag(mm_hash),
    }.get(case, pixels_tag(mm_hash))
    ref = route.put(torch.from_numpy(OTHER), "host-a", content_tag=tag)
    if case == "released":
        route.release([ref.lease_id])
    item = multimodal_pb2.MediaItem(data=source, mm_hash=mm_hash, pixels=ref)
    host_id = "host-b" if case == "other host" else "host-a"
    pixels, name = await resolve(loader, item, host_id)
    assert np.array_equal(pixels, PIXELS), "the source's pixels, not the segment's"
    assert name == mm_hash
    route.release([ref.lease_id])
