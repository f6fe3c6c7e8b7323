"""Proto <-> engine dataclasses for the requests of prefill and decode workers (no grpc)."""

from __future__ import annotations

from typing import Any

from epd.server.engine.base import Sampling, TokenChunk, Usage
from epd.server.worker.kv_handle import encode_kv_params
from epd.v1 import generation_pb2

FINISH_REASONS = {
    "stop": generation_pb2.FINISH_REASON_STOP,
    "length": generation_pb2.FINISH_REASON_LENGTH,
    "abort": generation_pb2.FINISH_REASON_ABORT,
}


def sampling_from_proto(params: generation_pb2.SamplingParams) -> Sampling:
    """Proto sampling with its documented defaults (0 max_tokens = 16, 0 top_p = 1)."""
    return Sampling(
        max_tokens=params.max_tokens or 16,
        temperature=params.temperature,
        top_p=params.top_p or 1.0,
        top_k=params.top_k,
        seed=params.seed if params.HasField("seed") else None,
        stop=tuple(params.stop),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
    )


def finish_reason_to_proto(reason: str | None) -> int:
    """FinishReason value of an engine finish reason (None: not finished)."""
    if reason is None:
        return generation_pb2.FINISH_REASON_UNSPECIFIED
    return FINISH_REASONS.get(reason, generation_pb2.FINISH_REASON_STOP)


def usage_to_proto(usage: Usage) -> generation_pb2.Usage:
    """Usage message of ``usage``."""
    return generation_pb2.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
    )


def chunk_fields(chunk: TokenChunk) -> dict[str, Any]:
    """Fields of a streamed token response (PrefillDecodeResponse, DecodeResponse) for ``chunk``."""
    fields: dict[str, Any] = {
        "token_ids": chunk.token_ids,
        "finish_reason": finish_reason_to_proto(chunk.finish_reason),
    }
    if chunk.usage is not None:
        fields["usage"] = usage_to_proto(chunk.usage)
    return fields


def kv_handle_to_proto(params: dict[str, Any] | None) -> generation_pb2.KvHandle:
    """KvHandle of an engine's KV transfer parameters (empty when there is nothing to decode)."""
    if not params:
        return generation_pb2.KvHandle()
    return generation_pb2.KvHandle(
        engine_id=str(params.get("remote_engine_id", "")), payload=encode_kv_params(params)
    )
