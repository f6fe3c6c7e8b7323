"""OpenAI chat-completions JSON <-> epd messages (no I/O).

The whole body is checked before any work (parameters in ``openai_params.PARAMS``, messages and
sizes here): anything malformed, out of range or not implemented is an ``InvalidArgument``
naming the parameter, which ``error_body`` turns into a 400 OpenAI error object.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from epd.common.errors import Code, EpdError
from epd.server.route.openai_params import MAX_NAME_CHARS, bad, check_params, clean, text
from epd.server.route.request_ids import ensure_request_id
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2

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
FINISH: dict[int, str] = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_ABORT: "abort",
}
# Client-chosen request ids (the X-Request-Id header vLLM's clients and benchmarks send).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# OpenAI's roles the chat templates know ("developer" is OpenAI's newer name for "system").
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MESSAGE_KEYS = frozenset({"role", "content", "name"})
IMAGE_DETAILS = ("auto", "low", "high")
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Sizes a body may have, checked before any work (tokenising, fetching images)."""

    max_messages: int = 2048
    max_parts_per_message: int = 256
    # Text characters over all messages: refuses text far beyond any context untokenised.
    max_prompt_chars: int = 1 << 20
    max_images: int = 16
    # The model's context in tokens: max_tokens above it is refused, and a body without
    # max_tokens gets it (the engine stops at the end of the context). None: unchecked, 16.
    max_context_tokens: int | None = None


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise bad(f"{param} must be a string", param)
    return clean(value, param)


def _image(part: dict[str, Any], param: str) -> route_service_pb2.ContentPart:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise bad("image_url parts need image_url.url", f"{param}.image_url")
    detail = image.get("detail") if isinstance(image, dict) else None
    if detail is not None and detail not in IMAGE_DETAILS:
        raise bad("image_url.detail must be auto, low or high", f"{param}.image_url.detail")
    media = multimodal_pb2.MediaItem(url=clean(url, f"{param}.image_url.url"))
    return route_service_pb2.ContentPart(image=media)


def _part(part: Any, param: str) -> route_service_pb2.ContentPart:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        return route_service_pb2.ContentPart(text=_text(part.get("text"), f"{param}.text"))
    if kind == "image_url":
        return _image(part, param)
    raise bad(f"unsupported content part type {str(kind)[:64]!r} (use text or image_url)", param)


def _content(
    content: Any, param: str, limits: RequestLimits
) -> list[route_service_pb2.ContentPart]:
    if isinstance(content, str):
        return [route_service_pb2.ContentPart(text=clean(content, param))]
    if not isinstance(content, list) or not content:
        raise bad("message content must be a string or a non-empty list of parts", param)
    if len(content) > limits.max_parts_per_message:
        raise bad(
            f"a message has at most {limits.max_parts_per_message} parts", param, "LIMIT_EXCEEDED"
        )
    return [_part(part, f"{param}[{index}]") for index, part in enumerate(content)]


def _message(message: Any, param: str, limits: RequestLimits) -> route_service_pb2.ChatMessage:
    if not isinstance(message, dict):
        raise bad("each message must be an object with a role and content", param)
    for key, value in message.items():
        # NOTE: clients echoing an assistant message send its unused fields as null.
        if key not in MESSAGE_KEYS and value is not None:
            shown = f"{param}.{str(key)[:MAX_NAME_CHARS]}"
            raise bad(f"{clean(shown, param)} is not supported", shown, "UNSUPPORTED_PARAMETER")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise bad("role must be system, developer, user or assistant", f"{param}.role")
    if message.get("name") is not None:
        text(MAX_NAME_CHARS)(message["name"], f"{param}.name")
    content = _content(message.get("content"), f"{param}.content", limits)
    return route_service_pb2.ChatMessage(role=ROLES[role], content=content)


def _num_chars(messages: list[Any]) -> int:
    """Characters of the text in ``messages`` as sent (before any check or copy)."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        parts = [content] if isinstance(content, str) else content
        for part in parts if isinstance(parts, list) else ():
            text = part.get("text") if isinstance(part, dict) else part
            total += len(text) if isinstance(text, str) else 0
    return total


def _chat(messages: Any, limits: RequestLimits) -> list[route_service_pb2.ChatMessage]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list", "messages")
    if len(messages) > limits.max_messages:
        raise bad(f"at most {limits.max_messages} messages", "messages", "LIMIT_EXCEEDED")
    if _num_chars(messages) > limits.max_prompt_chars:
        raise bad(
            f"the messages hold more than {limits.max_prompt_chars} characters of text",
            "messages",
            "LIMIT_EXCEEDED",
        )
    chat = [_message(m, f"messages[{index}]", limits) for index, m in enumerate(messages)]
    parts = [part for message in chat for part in message.content]
    if sum(part.HasField("image") for part in parts) > limits.max_images:
        raise bad(f"at most {limits.max_images} images a request", "messages", "LIMIT_EXCEEDED")
    return chat


def _sampling(values: dict[str, Any], limits: RequestLimits) -> generation_pb2.SamplingParams:
    name = "max_completion_tokens" if "max_completion_tokens" in values else "max_tokens"
    context = limits.max_context_tokens
    max_tokens = values.get(name, context or DEFAULT_MAX_TOKENS)
    if context is not None and max_tokens > context:
        raise bad(f"{name} is {max_tokens} but the model's context is {context} tokens", name)
    stop = values.get("stop", [])
    return generation_pb2.SamplingParams(
        max_tokens=max_tokens,
        temperature=values.get("temperature", 0.0),
        top_p=values.get("top_p", 1.0),
        top_k=max(0, values.get("top_k", 0)),
        seed=values.get("seed"),
        stop=stop,
        stop_token_ids=values.get("stop_token_ids", []),
        ignore_eos=values.get("ignore_eos", False),
    )


def to_generate_request(
    body: Any,
    default_model: str,
    request_id: str | None = None,
    limits: RequestLimits = RequestLimits(),
) -> route_service_pb2.GenerateRequest:
    """Check a chat-completions body whole and convert it; ``request_id`` (the X-Request-Id
    header) names the request in every hop and trace, a fresh one is made when it is None."""
    if request_id is not None and not REQUEST_ID.fullmatch(request_id):
        raise bad("X-Request-Id must be 1-128 letters, digits or . _ : -", "X-Request-Id")
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", "body")
    values = check_params(body)
    chat = _chat(body.get("messages"), limits)
    request = route_service_pb2.GenerateRequest(
        request_id=request_id or "",
        model=values.get("model") or default_model,
        messages=chat,
        sampling=_sampling(values, limits),
    )
    ensure_request_id(request)
    return request


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


def completion(
    request_id: str, model: str, text: str, finish: int, usage: generation_pb2.Usage | None
) -> dict[str, Any]:
    """A non-streamed chat.completion object."""
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "finish_reason": FINISH.get(finish, "stop"), "message": message}
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_json(usage),
    }


def chunk(
    request_id: str,
    model: str,
    delta: dict[str, str],
    finish: int | None,
    usage: generation_pb2.Usage | None = None,
) -> dict[str, Any]:
    """One chat.completion.chunk (an empty choices list with usage for the usage chunk)."""
    choice = {"index": 0, "delta": delta, "finish_reason": FINISH.get(finish) if finish else None}
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [] if usage is not None else [choice],
    }
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
