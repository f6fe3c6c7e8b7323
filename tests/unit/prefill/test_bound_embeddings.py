"""A prefill worker binds embeddings to their image only where their encoder's content tag says
so: then engines name them by the image, without hashing them; otherwise by their bytes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from epd.server.media.hashing import embeddings_tag, pixels_tag
from epd.server.transfer.plane import DataPlane
from epd.server.worker.images import ImageResolver
from epd.v1 import multimodal_pb2

IMAGE, OTHER = "ab" * 16, "cd" * 16


@pytest.fixture
def encoder() -> Iterator[DataPlane]:
    plane = DataPlane("host-a", kinds=("shm",))
    yield plane
    plane.close()


@pytest.mark.parametrize(
    ("tag", "is_bound"),
    [
        (embeddings_tag(IMAGE), True),
        (b"", False),
        (embeddings_tag(OTHER), False),
        (pixels_tag(IMAGE), False),
    ],
)
async def test_only_embeddings_tagged_as_their_image_are_bound_to_it(
    encoder: DataPlane, tag: bytes, is_bound: bool
) -> None:
    embeddings = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)
    ref = encoder.put(embeddings, "host-a", content_tag=tag)
    reader = DataPlane("host-a", kinds=("shm",))
    try:
        (image,) = await ImageResolver(reader).resolve(
            [multimodal_pb2.ImageInput(mm_hash=IMAGE, embeddings=ref)]
        )
    finally:
        reader.close()
    assert image.is_bound is is_bound
    assert image.embeddings is not None and torch.equal(image.embeddings, embeddings)
    encoder.release([ref.lease_id])
