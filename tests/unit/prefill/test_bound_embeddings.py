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


@pytest.mark.parametrize("is_bound", [True, False])
async def test_a_videos_chunks_join_in_order_after_the_images_with_the_videos_grid(
    encoder: DataPlane, is_bound: bool
) -> None:
    chunks = [torch.full((16, 16), float(i)) for i in range(2)]
    hashes = [f"{i}{i}" * 16 for i in range(2)]
    refs = [
        encoder.put(chunk, "host-a", content_tag=embeddings_tag(h) if is_bound else b"")
        for chunk, h in zip(chunks, hashes, strict=True)
    ]
    image = encoder.put(torch.ones(64, 16), "host-a")
    video = multimodal_pb2.VideoInput(
        mm_hash=OTHER,
        grid=multimodal_pb2.ImageGrid(t=2, h=8, w=8),
        chunks=refs,
        chunk_hashes=hashes,
        seconds_per_temporal_patch=1.0,
    )
    reader = DataPlane("host-a", kinds=("shm",))
    try:
        resolved = await ImageResolver(reader).resolve(
            [multimodal_pb2.ImageInput(mm_hash=IMAGE, embeddings=image)], [video]
        )
    finally:
        reader.close()
    assert [item.is_video for item in resolved] == [False, True]
    joined = resolved[1]
    assert (joined.mm_hash, joined.grid, joined.is_bound) == (OTHER, (2, 8, 8), is_bound)
    assert joined.embeddings is not None and torch.equal(joined.embeddings, torch.cat(chunks))
    encoder.release([ref.lease_id for ref in [*refs, image]])
