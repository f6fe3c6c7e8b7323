"""An in-memory engine for tests of the workers and servers around an engine (no model)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from epd.server.engine.base import Engine, EngineImage, PrefillResult, Sampling, TokenChunk, Usage
from epd.server.engine.prompt_check import VisionLayout
from epd.server.models.registry import family_named

STOP = TokenChunk(finish_reason="stop")
# A Qwen2-VL layout of small ids: vision start 5, image pad 6, 2x2 merge, 8-wide rows.
QWEN_LAYOUT = VisionLayout(
    vision_start_id=5,
    image_pad_id=6,
    merge_size=2,
    embedding_width=8,
    family=family_named("qwen2_vl"),
)
FIRST_TOKEN_ID = 7


class CannedEngine(Engine):
    """Answers every request with ``chunks`` (default: one empty chunk that stops), whatever
    its prompt; keeps the images of the last request. Takes embeddings on
    ``embeddings_device``. With ``kv_transfer_params``, a KV producer too: ``prefill`` answers
    ``FIRST_TOKEN_ID`` and those params at once, counted in ``num_prefilled``."""

    def __init__(
        self,
        chunks: Sequence[TokenChunk] = (STOP,),
        *,
        embeddings_device: str = "cpu",
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> None:
        self.model_id = "tiny"
        self.embeddings_device = embeddings_device
        self.chunks = list(chunks)
        self.kv_transfer_params = kv_transfer_params
        self.images: list[EngineImage] = []
        self.num_prefilled = 0

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> AsyncIterator[TokenChunk]:
        self.images = images
        for chunk in self.chunks:
            yield chunk

    async def prefill(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> PrefillResult:
        if self.kv_transfer_params is None:
            return await super().prefill(request_id, prompt_token_ids, images, sampling)
        self.num_prefilled += 1
        usage = Usage(len(prompt_token_ids), 1)
        return PrefillResult(FIRST_TOKEN_ID, None, dict(self.kv_transfer_params), usage)
