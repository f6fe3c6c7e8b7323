"""The prefill worker's logic (no grpc): resolve a prompt's images, run the engine.

Modes (the worker's role, chosen at start-up):
- ``prefill``: ``prefill`` only (first token + KV handle for a decode worker), from embeddings.
- ``prefill_decode``: ``generate`` only (aggregated PD), from embeddings.
- ``encode_prefill``: ``generate`` from embeddings or raw images and videos (the engine runs its
  own vision tower); also ``prefill`` when its engine is a KV producer (EP/D).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from opentelemetry import trace

from epd.common.errors import FailedPrecondition
from epd.common.roles import Role
from epd.server.engine.base import Engine, EngineImage, PrefillResult, Sampling, TokenChunk
from epd.server.media.loader import MediaLoader
from epd.server.media.video_loader import VideoLoader
from epd.server.prefill.metrics import PrefillMetrics
from epd.server.transfer.plane import DataPlane
from epd.server.worker.engine_worker import EngineDrain
from epd.server.worker.images import ImageResolver
from epd.v1 import generation_pb2

IMAGES_RESOLVED = "epd.images_resolved"
"""Span event: the prompt's images are ready for the engine (embeddings read, or pictures)."""


class PrefillWorker:
    """Runs prefills (KV handed to decode) or whole generations on one engine."""

    def __init__(
        self,
        engine: Engine,
        plane: DataPlane,
        mode: Role,
        loader: MediaLoader | None = None,
        *,
        hands_off_kv: bool = False,
        metrics: PrefillMetrics | None = None,
        videos: VideoLoader | None = None,
    ) -> None:
        """``mode``: the role served, one of ``PREFILL_MODES``; ``hands_off_kv``: the engine is
        a KV producer (always so in prefill mode); ``metrics``: where image hand-off times go
        (None: nowhere); ``videos``: decodes a raw video (encode_prefill) whose frames the
        route shared where this worker cannot read them (None: such a video is refused)."""
        self.metrics = metrics
        self.engine = engine
        self.plane = plane
        self.mode = mode
        self.hands_off_kv = hands_off_kv or mode is Role.PREFILL
        self.images = ImageResolver(
            plane,
            loader if mode is Role.ENCODE_PREFILL else None,
            device=engine.embeddings_device,
            videos=videos if mode is Role.ENCODE_PREFILL else None,
        )
        # NOTE: a KV producer settles once every block handed to a decode worker was pulled.
        self.drain = EngineDrain(engine, "prefill", holds_kv=self.hands_off_kv)

    async def generate(
        self, request_id: str, model: str, prompt: generation_pb2.Prompt, sampling: Sampling
    ) -> AsyncIterator[TokenChunk]:
        """Stream the whole generation of ``prompt`` (prefill_decode, encode_prefill)."""
        if self.mode is Role.PREFILL:
            raise FailedPrecondition(
                "this worker runs in prefill mode: call Prefill and hand "
                "the KV handle to a decode worker",
                reason="WRONG_MODE",
            )
        self.drain.admit(request_id, model)
        images = await self._images(prompt)
        async for chunk in self.engine.generate(
            request_id, list(prompt.token_ids), images, sampling
        ):
            yield chunk

    async def prefill(
        self, request_id: str, model: str, prompt: generation_pb2.Prompt, sampling: Sampling
    ) -> PrefillResult:
        """First token and KV transfer parameters (prefill, encode_prefill with KV hand-off)."""
        if not self.hands_off_kv:
            raise FailedPrecondition(
                f"this worker runs in {self.mode.label} mode without KV hand-off and serves "
                "PrefillDecode; Prefill needs a worker in prefill mode",
                reason="WRONG_MODE",
            )
        self.drain.admit(request_id, model)
        images = await self._images(prompt)
        return await self.engine.prefill(request_id, list(prompt.token_ids), images, sampling)

    async def _images(self, prompt: generation_pb2.Prompt) -> list[EngineImage]:
        """The engine's inputs for the prompt's images, timed when there are any (a metric
        and an ``epd.images_resolved`` event on the current span)."""
        if not (prompt.images or prompt.videos):
            return []
        start = time.monotonic()
        images = await self.images.resolve(prompt.images, prompt.videos)
        trace.get_current_span().add_event(IMAGES_RESOLVED)
        if self.metrics is not None:
            self.metrics.embedding_handoff.observe(time.monotonic() - start)
        return images
