"""ImageInput messages -> EngineImage (no grpc): pull embeddings, load raw images, or grids only.

Embeddings are pulled through the data plane as private copies, so the caller may release the
encoder's leases as soon as the call returns. Images named by their encoder (EncoderSource) are
fetched there first (``EmbeddingFetcher``) and released by this worker. Raw images are loaded
under the media rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from epd.server.common.errors import FailedPrecondition, InvalidArgument
from epd.server.common.tasks import every
from epd.server.engine.base import EngineImage, Grid
from epd.server.media.loader import MediaLoader
from epd.server.transfer.plane import DataPlane
from epd.v1 import multimodal_pb2, tensor_pb2


class EmbeddingFetcher(Protocol):
    """Gets embeddings from the encoder that makes them (``encoders.EncoderPulls``)."""

    async def fetch(self, endpoint: str, mm_hash: str,
                    consumer_host_id: str) -> tensor_pb2.TensorRef:  # fmt: skip
        """A reference to the embeddings of ``mm_hash``, once the encoder has them."""
        ...

    def release(self, endpoint: str, lease_ids: list[str]) -> None:
        """Free the references (in the background)."""
        ...


def check_request(request_id: str, model: str, served_model: str) -> None:
    """InvalidArgument for an empty request id or another model than ``served_model``."""
    if not request_id:
        raise InvalidArgument("request_id must not be empty", reason="MISSING_REQUEST_ID")
    if model and model != served_model:
        raise InvalidArgument(f"this worker serves {served_model!r}, not {model!r}",
                              reason="WRONG_MODEL")  # fmt: skip


def grid_of(image: multimodal_pb2.ImageInput) -> Grid | None:
    """The image's (t, h, w) patch grid, or None when the message has none."""
    return (image.grid.t, image.grid.h, image.grid.w) if image.HasField("grid") else None


def grids_only(images: Sequence[multimodal_pb2.ImageInput],
               fallback: Sequence[Sequence[float]] = ()) -> list[EngineImage]:  # fmt: skip
    """Images as grids (their KV is pulled, never recomputed); ``fallback`` fills absent grids."""
    resolved = []
    for i, image in enumerate(images):
        grid = grid_of(image)
        if grid is None and i < len(fallback) and len(fallback[i]) == 3:
            t, h, w = (int(v) for v in fallback[i])  # NOTE: Struct numbers arrive as floats
            grid = (t, h, w)
        resolved.append(EngineImage(image.mm_hash, grid))
    return resolved


class ImageResolver:
    """Turns a prompt's ImageInputs into engine images for one worker."""

    def __init__(self, plane: DataPlane, loader: MediaLoader | None = None,
                 encoders: EmbeddingFetcher | None = None) -> None:  # fmt: skip
        """``loader`` None: raw images are refused (the worker takes embeddings only);
        ``encoders`` None: images named by their encoder are refused."""
        self.plane = plane
        self.loader = loader
        self.encoders = encoders

    async def resolve(self, images: Sequence[multimodal_pb2.ImageInput]) -> list[EngineImage]:
        """Engine images in prompt order (embeddings copied out of the data plane)."""
        if any(image.WhichOneof("source") == "encoder" for image in images):
            return await every([self._resolve(i, image) for i, image in enumerate(images)])
        return [await self._resolve(i, image) for i, image in enumerate(images)]

    async def _resolve(self, index: int, image: multimodal_pb2.ImageInput) -> EngineImage:
        source = image.WhichOneof("source")
        if source == "embeddings":
            tensor = self.plane.get(image.embeddings, copy=True)
            return EngineImage(image.mm_hash, grid_of(image), embeddings=tensor)
        if source == "encoder":
            return await self._fetched(index, image)
        if source == "media":
            if self.loader is None:
                raise FailedPrecondition("this worker takes image embeddings, not raw images; "
                                         "send raw images to an encode_prefill worker",
                                         reason="RAW_IMAGES_UNSUPPORTED")  # fmt: skip
            loaded = await self.loader.load(url=image.media.url, data=image.media.data)
            return EngineImage(loaded.mm_hash, grid_of(image), image=loaded.image)
        raise InvalidArgument(f"image {index} has neither embeddings nor media",
                              reason="MISSING_IMAGE_DATA")  # fmt: skip

    async def _fetched(self, index: int, image: multimodal_pb2.ImageInput) -> EngineImage:
        if self.encoders is None:
            raise FailedPrecondition("this worker does not fetch embeddings from encoders; send "
                                     "them as TensorRefs", reason="ENCODER_SOURCE_UNSUPPORTED")
        if not image.mm_hash or not image.encoder.endpoint:
            raise InvalidArgument(f"image {index} names an encoder but lacks its mm_hash or "
                                  "endpoint", reason="BAD_ENCODER_SOURCE")  # fmt: skip
        endpoint = image.encoder.endpoint
        ref = await self.encoders.fetch(endpoint, image.mm_hash, self.plane.host_id)
        try:
            tensor = self.plane.get(ref, copy=True)
        finally:
            self.encoders.release(endpoint, [ref.lease_id])
        return EngineImage(image.mm_hash, grid_of(image), embeddings=tensor)
