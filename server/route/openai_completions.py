"""OpenAI completions JSON <-> epd (no I/O): ``/v1/completions`` as ``vllm serve`` answers it.

A body is parsed by vLLM's own ``CompletionRequest`` (its types, ranges, defaults: 16 tokens);
its prompt, text or token ids, goes to the engines as it is, with no chat template and no image.
One prompt a request (a list of prompts is refused by name, as are the fields epd does not
implement yet); ``echo`` repeats the prompt's text before the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epd.common.generation import finish_reason_name
from epd.server.route.openai_schema import (
    SAMPLING_FIELDS,
    Answer,
    envelope,
    parse_with,
    refuse_unimplemented,
    total_usage,
    usage_json,
    vllm_sampling,
)
from epd.server.route.request import ChatRequest, bad, new_request_id
from epd.server.route.request_check import RequestLimits, check_request, check_request_id
from epd.v1 import generation_pb2

# vLLM's CompletionRequest fields epd implements.
IMPLEMENTED_FIELDS = SAMPLING_FIELDS | {"prompt", "echo", "add_special_tokens"}


@dataclass(frozen=True, slots=True)
class CompletionPrompt:
    """A completion's prompt: its token ids, and its text when ``echo`` repeats it."""

    token_ids: list[int]
    echo: str | None = None


def to_completion_request(
    body: Any,
    default_model: str,
    tokenizer: Any,
    request_id: str | None = None,
    limits: RequestLimits | None = None,
    defaults: dict[str, Any] | None = None,
) -> tuple[ChatRequest, CompletionPrompt]:
    """Check a completions body whole, as vLLM's OpenAI server does, and convert it;
    ``tokenizer`` tokenises a text prompt as vLLM's renderer does."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    if request_id is not None:
        check_request_id(request_id, "X-Request-Id")
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", "body")
    parsed = parse_with(CompletionRequest, body)
    refuse_unimplemented(parsed, IMPLEMENTED_FIELDS)
    prompt = _prompt(parsed, tokenizer)
    if parsed.echo and parsed.logprobs is not None:
        raise bad("echo with logprobs is not supported by epd yet", "echo", "UNSUPPORTED_PARAMETER")
    limits = limits or RequestLimits()
    context = limits.max_context_tokens
    max_tokens = parsed.max_tokens
    if max_tokens is None or (context is not None and max_tokens > context):
        max_tokens = context or 16
    request = ChatRequest(
        new_request_id(request_id),
        parsed.model or default_model,
        [],
        vllm_sampling(parsed, max_tokens, defaults or {}),
        prompt_token_ids=prompt.token_ids,
    )
    check_request(request, limits)
    return request, prompt


def _prompt(parsed: Any, tokenizer: Any) -> CompletionPrompt:
    prompt = parsed.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise bad(
                "a list of prompts is not supported by epd yet", "prompt", "UNSUPPORTED_PARAMETER"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=parsed.add_special_tokens)["input_ids"]
        return CompletionPrompt(list(ids), prompt if parsed.echo else None)
    ids = [int(token) for token in prompt]
    if not ids:
        raise bad("the prompt is empty", "prompt")
    if not all(0 <= token < len(tokenizer) for token in ids):
        raise bad(f"the prompt holds token ids outside [0, {len(tokenizer)})", "prompt")
    return CompletionPrompt(ids, tokenizer.decode(ids) if parsed.echo else None)


def completion_json(
    request_id: str, model: str, answers: list[Answer], logprobs: list[dict[str, Any] | None]
) -> dict[str, Any]:
    """A non-streamed text_completion object, one choice per answer."""
    choices = [
        {
            "index": index,
            "text": "".join(answer.texts),
            "logprobs": logprobs[index],
            "finish_reason": finish_reason_name(answer.finish) or "stop",
        }
        for index, answer in enumerate(answers)
    ]
    body = envelope(f"cmpl-{request_id}", "text_completion", model, choices)
    return {**body, "usage": usage_json(total_usage(answers))}


def completion_chunk(
    request_id: str,
    model: str,
    text: str,
    finish: int,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
    usage: generation_pb2.Usage | None = None,
) -> dict[str, Any]:
    """One streamed text_completion (an empty choices list with usage for the usage chunk)."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason_name(finish),
    }
    choices = [] if usage is not None else [choice]
    body = envelope(f"cmpl-{request_id}", "text_completion", model, choices)
    if usage is not None:
        body["usage"] = usage_json(usage)
    return body


def completion_logprobs_json(
    positions: list[generation_pb2.TokenLogprobs],
    num_top: int,
    decode: Callable[[int], str],
    text_offset: int = 0,
) -> dict[str, Any]:
    """OpenAI's completion logprobs of ``positions`` as vLLM's server writes them: tokens, their
    log probabilities, the ``num_top`` + 1 first candidates of each (the generated token first)
    and each token's offset in the text, from ``text_offset``."""
    tokens: list[str] = []
    offsets: list[int] = []
    for position in positions:
        offsets.append(text_offset + sum(map(len, tokens)))
        tokens.append(_text_of(position.candidates[0], decode))
    return {
        "text_offset": offsets,
        "token_logprobs": [max(p.candidates[0].logprob, -9999.0) for p in positions],
        "tokens": tokens,
        "top_logprobs": [
            {
                _text_of(c, decode): max(c.logprob, -9999.0)
                for c in position.candidates[: num_top + 1]
            }
            for position in positions
        ],
    }


def _text_of(candidate: generation_pb2.Logprob, decode: Callable[[int], str]) -> str:
    return candidate.token if candidate.HasField("token") else decode(candidate.token_id)
