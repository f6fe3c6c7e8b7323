"""epd's answers as OpenAI JSON (no I/O): a completion gathered from its route chunks
(``Answer``), the chat.completion object and its stream's chunks, usage, vLLM's
``return_token_ids`` and the OpenAI error object of an ``EpdError``, as vLLM's OpenAI server
writes them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epd.common.errors import Code, EpdError
from epd.common.generation import finish_reason_name
from epd.server.route.openai_logprobs import prompt_logprobs_json
from epd.v1 import generation_pb2

if TYPE_CHECKING:
    from epd.server.route.router import RouteChunk

HTTP_STATUS = {
    Code.INVALID_ARGUMENT: 400,
    Code.NOT_FOUND: 404,
    Code.FAILED_PRECONDITION: 400,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.UNAVAILABLE: 503,
    Code.DEADLINE_EXCEEDED: 504,
    Code.UNAUTHENTICATED: 401,
    Code.ALREADY_EXISTS: 409,
}
# Reasons OpenAI's API has its own code for; any other reason is the code as it is.
OPENAI_CODES = {"MODEL_NOT_FOUND": "model_not_found"}


def error_body(err: Exception) -> tuple[int, dict[str, Any]]:
    """HTTP status and OpenAI-style error object for ``err`` (any exception but an EpdError is
    a 500 without details)."""
    if not isinstance(err, EpdError):
        error = {"message": "internal server error", "type": "server_error", "param": None}
        return 500, {"error": {**error, "code": "INTERNAL"}}
    status = HTTP_STATUS.get(err.code, 500)
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = OPENAI_CODES.get(err.reason, err.reason)
    param = err.metadata.get("param")
    return status, {"error": {"message": err.message, "type": kind, "param": param, "code": code}}


@dataclass
class Answer:
    """One completion, gathered from its chunks."""

    texts: list[str] = field(default_factory=list)
    positions: list[generation_pb2.TokenLogprobs] = field(default_factory=list)
    # one per prompt token, when prompt_logprobs were asked for
    prompt_positions: list[generation_pb2.TokenLogprobs] = field(default_factory=list)
    finish: int = 0
    usage: generation_pb2.Usage | None = None
    token_ids: list[int] = field(default_factory=list)
    # the prompt as the engine holds it, when the request asked for it (vLLM's return_token_ids)
    prompt_token_ids: list[int] | None = None
    # the chat template's text, when the request asked for it (vLLM's return_prompt_text)
    prompt_text: str | None = None

    def add(self, chunk: RouteChunk) -> None:
        """Gather a chunk of this completion."""
        self.texts.append(chunk.text)
        if chunk.prompt_token_ids is not None:
            self.prompt_token_ids = chunk.prompt_token_ids
        if chunk.prompt_text is not None:
            self.prompt_text = chunk.prompt_text
        self.token_ids.extend(chunk.token_ids)
        self.positions.extend(chunk.logprobs)
        self.prompt_positions.extend(chunk.prompt_logprobs)
        self.finish = chunk.finish_reason or self.finish
        self.usage = chunk.usage or self.usage


def completion(
    request_id: str,
    model: str,
    answers: list[Answer],
    logprobs: list[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """A non-streamed chat.completion object, one choice per answer (``logprobs``: each one's
    ``logprobs_json``, when asked)."""
    choices = [
        {
            "index": index,
            "finish_reason": finish_reason_name(answer.finish) or "stop",
            "message": {"role": "assistant", "content": "".join(answer.texts)},
            "logprobs": logprobs[index] if logprobs else None,
        }
        for index, answer in enumerate(answers)
    ]
    body = envelope(f"chatcmpl-{request_id}", "chat.completion", model, choices)
    prompt = answers[0].prompt_positions if answers else []
    body["prompt_logprobs"] = prompt_logprobs_json(prompt) if prompt else None
    return {**body, "usage": usage_json(total_usage(answers))}


def add_token_ids(body: dict[str, Any], answers: list[Answer], parsing: Any) -> None:
    """vLLM's return_token_ids on a whole answer: the prompt's token ids as the engine holds
    them, and each choice's generated ids (not with a parser that hides the reasoning:
    ``parsing.hides_metadata``)."""
    body["prompt_token_ids"] = answers[0].prompt_token_ids if answers else None
    hidden = parsing is not None and parsing.hides_metadata
    for choice, answer in zip(body["choices"], answers, strict=True):
        choice["token_ids"] = None if hidden else list(answer.token_ids)


def envelope(ident: str, kind: str, model: str, choices: list[Any]) -> dict[str, Any]:
    """The fields every OpenAI completion object and chunk starts with."""
    return {
        "id": ident,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }


def total_usage(answers: list[Answer]) -> generation_pb2.Usage | None:
    """The usage of a request's completions together, as vLLM counts it: the prompt once, the
    completions' tokens summed (None: none reported)."""
    usages = [answer.usage for answer in answers if answer.usage is not None]
    if not usages:
        return None
    return generation_pb2.Usage(
        prompt_tokens=usages[0].prompt_tokens,
        completion_tokens=sum(usage.completion_tokens for usage in usages),
        cached_prompt_tokens=usages[0].cached_prompt_tokens,
    )


def chunk(
    request_id: str,
    model: str,
    delta: dict[str, str],
    finish: int | None,
    usage: generation_pb2.Usage | None = None,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """One chat.completion.chunk of completion ``index`` (an empty choices list with usage for
    the usage chunk; ``logprobs``: ``logprobs_json``'s of the delta's tokens, when asked)."""
    choice = {
        "index": index,
        "delta": delta,
        "finish_reason": finish_reason_name(finish or 0),
        "logprobs": logprobs,
    }
    choices = [] if usage is not None else [choice]
    body = envelope(f"chatcmpl-{request_id}", "chat.completion.chunk", model, choices)
    if usage is not None:
        body["usage"] = usage_json(usage)
    return body


def usage_json(usage: generation_pb2.Usage | None) -> dict[str, int]:
    """OpenAI usage object."""
    prompt = usage.prompt_tokens if usage else 0
    completion_tokens = usage.completion_tokens if usage else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
