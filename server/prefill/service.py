"""The prefill worker's logic (no grpc): resolve a prompt's images, run the engine.

Embeddings are pulled through the data plane as private copies, so the caller may release the
encoder's leases as soon as the first token arrives. Raw images (encode_prefill mode) are loaded
under the media rules and encoded by the engine's own vision tower.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator

from epd.server.common.errors import FailedPrecondition, InvalidArgument
from epd.server.engine.base import Engine, EngineImage, Sampling, TokenChunk
from epd.server.media.loader import MediaLoader
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2, multimodal_pb2


class Mode(enum.Enum):
    """What a prefill worker serves."""

    PREFILL_DECODE = "prefill_decode"
    ENCODE_PREFILL = "encode_prefill"


class PrefillWorker:
    """Runs whole generations (aggregated prefill + decode) on one engine."""

    def __init__(self, engine: Engine, plane: DataPlane, mode: Mode,
                 loader: MediaLoader | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.plane = plane
        self.mode = mode
        self.loader = loader

    async def generate(self, request_id: str, model: str, prompt: generation_pb2.Prompt,
                       sampling: Sampling) -> AsyncIterator[TokenChunk]:  # fmt: skip
        """Stream the generation of ``prompt``."""
        if not request_id:
            raise InvalidArgument("request_id must not be empty", reason="MISSING_REQUEST_ID")
        if model and model != self.engine.model_id:
            raise InvalidArgument(f"this worker serves {self.engine.model_id!r}, not {model!r}",
                                  reason="WRONG_MODEL")  # fmt: skip
        images = [await self._resolve(i, image) for i, image in enumerate(prompt.images)]
        async for chunk in self.engine.generate(request_id, list(prompt.token_ids), images,
                                                sampling):  # fmt: skip
            yield chunk

    async def _resolve(self, index: int, image: multimodal_pb2.ImageInput) -> EngineImage:
        source = image.WhichOneof("source")
        grid = (image.grid.t, image.grid.h, image.grid.w) if image.HasField("grid") else None
        if source == "embeddings":
            tensor = self.plane.get(image.embeddings, copy=True)
            return EngineImage(image.mm_hash, grid, embeddings=tensor)
        if source == "media":
            if self.mode is not Mode.ENCODE_PREFILL or self.loader is None:
                raise FailedPrecondition("this worker takes image embeddings, not raw images; "
                                         "send raw images to an encode_prefill worker",
                                         reason="RAW_IMAGES_UNSUPPORTED")  # fmt: skip
            loaded = await self.loader.load(url=image.media.url, data=image.media.data)
            return EngineImage(loaded.mm_hash, grid, image=loaded.image)
        raise InvalidArgument(f"image {index} has neither embeddings nor media",
                              reason="MISSING_IMAGE_DATA")  # fmt: skip
