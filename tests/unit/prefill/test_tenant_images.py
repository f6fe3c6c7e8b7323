"""An encode_prefill worker that loads a tenant's image from its source (no readable pixels)
names it in vLLM's caches by the salted mm_hash the route sent, not by the plain content hash
another tenant's request would give."""

from __future__ import annotations

from epd.server.media.hashing import key_salt, salted
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.transfer.plane import DataPlane
from epd.server.worker.images import ImageResolver
from epd.v1 import multimodal_pb2
from tests.unit.prefill.test_shared_pixels import PIXELS, png


async def name_of(item: multimodal_pb2.MediaItem) -> str:
    loader = MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="x")
    worker = DataPlane("host-b", kinds=("shm",))
    try:
        (image,) = await ImageResolver(worker, loader).resolve(
            [multimodal_pb2.ImageInput(mm_hash=item.mm_hash, media=item)]
        )
    finally:
        worker.close()
    return image.mm_hash


async def test_a_tenant_s_image_loaded_from_its_source_keeps_its_salted_name() -> None:
    source = png(PIXELS)
    plain = await name_of(multimodal_pb2.MediaItem(data=source))
    salt = key_salt("tenant", "")
    tenant_item = multimodal_pb2.MediaItem(data=source, mm_hash=salted(plain, salt), key_salt=salt)
    assert await name_of(tenant_item) == salted(plain, salt) != plain
