"""Proto <-> engine dataclasses for the requests of prefill and decode workers (no grpc): the
sampling, the streamed tokens, and the KV handle, an engine's KV transfer parameters as the
KvHandle message's opaque payload and back.

The prefill worker encodes its engine's ``kv_transfer_params`` once, the route passes the bytes
on untouched, and the decode worker decodes them once for its engine. The encoding is a UTF-8
JSON object: it keeps ints as ints (block ids, ports), floats exact (Python writes the shortest
repr that reads back to the same double), strings, booleans, None and nesting; tuples come back
as lists. Keys must be strings.
"""

from __future__ import annotations

import json
from typing import Any

from epd.common.errors import InvalidArgument
from epd.common.generation import SAMPLING_DEFAULTS, finish_reason_value
from epd.server.engine.base import (
    Candidates,
    PrefillResult,
    RepetitionDetection,
    Sampling,
    StructuredOutput,
    TokenChunk,
    Usage,
)
from epd.v1 import generation_pb2


def sampling_from_proto(params: generation_pb2.SamplingParams) -> Sampling:
    """Proto sampling with vLLM's defaults for the fields left unset: ``SAMPLING_DEFAULTS``'
    max_tokens and top_p for zero, a repetition penalty of 1.0 for zero, and the two
    special-token options true when unset; the others' defaults are their zero values."""
    return Sampling(
        max_tokens=params.max_tokens or SAMPLING_DEFAULTS.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p or SAMPLING_DEFAULTS.top_p,
        top_k=params.top_k,
        seed=params.seed if params.HasField("seed") else None,
        stop=tuple(params.stop),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty or 1.0,
        min_p=params.min_p,
        min_tokens=params.min_tokens,
        logit_bias=tuple(sorted(params.logit_bias.items())),
        bad_words=tuple(params.bad_words),
        allowed_token_ids=tuple(params.allowed_token_ids),
        include_stop_str_in_output=params.include_stop_str_in_output,
        structured_output=structured_output_from_proto(params),
        logprobs=params.logprobs if params.HasField("logprobs") else None,
        prompt_logprobs=params.prompt_logprobs if params.HasField("prompt_logprobs") else None,
        # NOTE: unset is true, vLLM's default
        skip_special_tokens=params.skip_special_tokens
        or not params.HasField("skip_special_tokens"),
        spaces_between_special_tokens=params.spaces_between_special_tokens
        or not params.HasField("spaces_between_special_tokens"),
        priority=params.priority,
        cache_salt=params.cache_salt,
        thinking_token_budget=(
            params.thinking_token_budget if params.HasField("thinking_token_budget") else None
        ),
        repetition_detection=(
            RepetitionDetection(
                params.repetition_detection.max_pattern_size,
                params.repetition_detection.min_pattern_size,
                params.repetition_detection.min_count,
            )
            if params.HasField("repetition_detection")
            else None
        ),
        vllm_xargs=params.vllm_xargs,
        logprob_token_ids=tuple(params.logprob_token_ids),
    )


def structured_output_from_proto(params: generation_pb2.SamplingParams) -> StructuredOutput | None:
    """The constraint ``params`` names, or None."""
    if not params.HasField("structured_output"):
        return None
    constraint = params.structured_output
    kind = constraint.WhichOneof("constraint")
    if kind is None:
        return None
    value: str | tuple[str, ...] = ""
    if kind == "choice":
        value = tuple(constraint.choice.values)
    elif kind != "json_object":
        value = str(getattr(constraint, kind))
    return StructuredOutput(
        "json" if kind == "json_schema" else kind,
        value,
        disable_any_whitespace=constraint.disable_any_whitespace,
        disable_additional_properties=constraint.disable_additional_properties,
        whitespace_pattern=(
            constraint.whitespace_pattern if constraint.HasField("whitespace_pattern") else None
        ),
        reasoning_ended=(
            constraint.reasoning_ended if constraint.HasField("reasoning_ended") else None
        ),
        chat_template_kwargs=constraint.chat_template_kwargs,
    )


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
        "finish_reason": finish_reason_value(chunk.finish_reason),
    }
    if chunk.usage is not None:
        fields["usage"] = usage_to_proto(chunk.usage)
    if chunk.logprobs:
        fields["logprobs"] = [logprobs_to_proto(position) for position in chunk.logprobs]
    if chunk.prompt_logprobs:
        fields["prompt_logprobs"] = [logprobs_to_proto(p) for p in chunk.prompt_logprobs]
    return fields


def prefill_fields(result: PrefillResult) -> dict[str, Any]:
    """Fields of the PrefillResponse for ``result``."""
    fields: dict[str, Any] = {
        "first_token_id": result.first_token_id,
        "finish_reason": finish_reason_value(result.finish_reason),
        "kv_handle": kv_handle_to_proto(result.kv_transfer_params),
        "usage": usage_to_proto(result.usage),
        "prompt_logprobs": [logprobs_to_proto(p) for p in result.prompt_logprobs],
    }
    if result.first_logprobs is not None:
        fields["first_token_logprobs"] = logprobs_to_proto(result.first_logprobs)
    return fields


def logprobs_to_proto(position: Candidates) -> generation_pb2.TokenLogprobs:
    """The TokenLogprobs of one position's candidates (empty: the prompt's first position,
    which has none)."""
    return generation_pb2.TokenLogprobs(
        candidates=[
            generation_pb2.Logprob(token_id=token, logprob=logprob, rank=rank, token=text)
            for token, logprob, rank, text in position
        ]
    )


def kv_handle_to_proto(params: dict[str, Any] | None) -> generation_pb2.KvHandle:
    """KvHandle of an engine's KV transfer parameters (empty when there is nothing to decode)."""
    if not params:
        return generation_pb2.KvHandle()
    return generation_pb2.KvHandle(
        engine_id=str(params.get("remote_engine_id", "")),
        payload=json.dumps(params, separators=(",", ":")).encode(),
    )


def decode_kv_params(payload: bytes) -> dict[str, Any]:
    """The KV transfer parameters in ``payload``; INVALID_ARGUMENT ``BAD_KV_HANDLE`` when it is
    not a JSON object (a caller's mistake, never an engine's: reported without a traceback)."""
    try:
        params = json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise InvalidArgument(
            f"kv_handle.payload is not the JSON a prefill worker returned: {e}",
            reason="BAD_KV_HANDLE",
        ) from e
    if not isinstance(params, dict):
        raise InvalidArgument(
            f"kv_handle.payload must be a JSON object, not {type(params).__name__}",
            reason="BAD_KV_HANDLE",
        )
    return params
