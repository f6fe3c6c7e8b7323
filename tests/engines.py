"""An in-memory engine for tests of the workers and servers around an engine (no model)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from epd.server.engine.base import Engine, EngineImage, Sampling, TokenChunk

STOP = TokenChunk(finish_reason="stop")


class CannedEngine(Engine):
    """Answers every request with ``chunks`` (default: one empty chunk that stops), whatever
    its prompt; keeps the images of the last request. Takes embeddings on
    ``embeddings_device``."""

    def __init__(
        self, chunks: Sequence[TokenChunk] = (STOP,), *, embeddings_device: str = "cpu"
    ) -> None:
        self.model_id = "tiny"
        self.embeddings_device = embeddings_device
        self.chunks = list(chunks)
        self.images: list[EngineImage] = []

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
