"""The decode worker's logic (no grpc): pull a prefilled request's KV cache, stream its tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator

from epd.common.errors import InvalidArgument
from epd.server.engine.base import Engine, Sampling, TokenChunk
from epd.server.worker.convert import decode_kv_params
from epd.server.worker.engine_worker import EngineDrain


class DecodeWorker:
    """Runs the decode half of P/D requests on a KV-consumer engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # NOTE: settled once the engine runs nothing: no stream is cut short.
        self.drain = EngineDrain(engine, "decode")

    async def decode(
        self,
        request_id: str,
        model: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        first_token_id: int,
        kv_handle: bytes,
    ) -> AsyncIterator[TokenChunk]:
        """Stream the tokens after ``first_token_id`` (usage on the last chunk covers it too).

        ``kv_handle`` is the payload of the KvHandle Prefill returned, decoded here once for the
        engine: the one carrier of what the engine needs of the prompt's images (their KV is
        pulled) and of the seed the prefill sampled with.
        """
        self.drain.admit(request_id, model)
        if not kv_handle:
            raise InvalidArgument(
                "kv_handle is empty: pass the one Prefill returned", reason="MISSING_KV_HANDLE"
            )
        kv_params = decode_kv_params(kv_handle)
        async for chunk in self.engine.decode(
            request_id, prompt_token_ids, sampling, first_token_id, kv_params
        ):
            yield chunk
