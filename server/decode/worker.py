"""The decode worker's logic (no grpc): pull a prefilled request's KV cache, stream its tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from epd.common.errors import InvalidArgument
from epd.server.engine.base import IMAGE_GRIDS_KEY, Engine, Sampling, TokenChunk
from epd.server.worker.images import check_request, grids_only
from epd.v1 import generation_pb2


class DecodeWorker:
    """Runs the decode half of P/D requests on a KV-consumer engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def decode(
        self,
        request_id: str,
        model: str,
        prompt: generation_pb2.Prompt,
        sampling: Sampling,
        first_token_id: int,
        kv_params: dict[str, Any],
    ) -> AsyncIterator[TokenChunk]:
        """Stream the tokens after ``first_token_id`` (usage on the last chunk covers it too).

        Images need only their grids: taken from the prompt, else from the prefill's handle.
        """
        check_request(request_id, model, self.engine.model_id)
        if not kv_params:
            raise InvalidArgument(
                "kv_handle is empty: pass the one Prefill returned", reason="MISSING_KV_HANDLE"
            )
        images = grids_only(prompt.images, kv_params.get(IMAGE_GRIDS_KEY) or ())
        async for chunk in self.engine.decode(
            request_id, list(prompt.token_ids), images, sampling, first_token_id, kv_params
        ):
            yield chunk
