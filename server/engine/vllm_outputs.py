"""vLLM's ``RequestOutput``s as the engine's chunks, and the error of a request vLLM failed (no
engine state: ``VllmEngine`` streams through these)."""

from __future__ import annotations

from typing import Any

from epd.common.errors import Unavailable
from epd.server.engine.base import KV_LOAD_FAILED, TokenChunk, Usage
from epd.server.engine.vllm_inputs import candidates, prompt_candidates


def request_failed(params: Any) -> Unavailable:
    """The error for a request vLLM finished with reason ``error`` (retryable, request-level):
    on a decode worker, the KV it was to read from its prefill worker could not be loaded (the
    prefill worker died or dropped it; vLLM's ``kv_load_failure_policy`` is ``fail``)."""
    kv_params = (params.extra_args or {}).get("kv_transfer_params") or {}
    if kv_params.get("do_remote_prefill"):
        return Unavailable(
            "the request's KV could not be loaded from its prefill worker",
            reason=KV_LOAD_FAILED,
        )
    return Unavailable("the engine failed the request", reason="ENGINE_REQUEST_FAILED")


def chunk_of(output: Any, prompt_token_ids: list[int], num_generated: int) -> TokenChunk:
    """A delta output as a chunk; ``num_generated`` counts the request's tokens so far."""
    completion = output.outputs[0]
    logprobs = [candidates(position) for position in completion.logprobs or []]
    prompt_logprobs = prompt_candidates(output.prompt_logprobs) if output.prompt_logprobs else []
    if not output.finished:
        return TokenChunk(
            list(completion.token_ids), logprobs=logprobs, prompt_logprobs=prompt_logprobs
        )
    num_prompt = len(output.prompt_token_ids or prompt_token_ids)
    return TokenChunk(
        list(completion.token_ids),
        completion.finish_reason,
        Usage(num_prompt, num_generated, output.num_cached_tokens or 0),
        logprobs,
        prompt_logprobs,
    )
