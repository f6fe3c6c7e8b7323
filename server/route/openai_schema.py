"""OpenAI chat-completions JSON <-> epd messages (no I/O)."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from epd.server.common.errors import Code, EpdError, InvalidArgument
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2

HTTP_STATUS = {Code.INVALID_ARGUMENT: 400, Code.NOT_FOUND: 404, Code.FAILED_PRECONDITION: 400,
               Code.RESOURCE_EXHAUSTED: 429, Code.UNAVAILABLE: 503, Code.DEADLINE_EXCEEDED: 504,
               Code.UNAUTHENTICATED: 401, Code.ALREADY_EXISTS: 409}  # fmt: skip
FINISH: dict[int, str] = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_ABORT: "abort",
}


# Client-chosen request ids (the X-Request-Id header vLLM's clients and benchmarks send).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _bad(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(message, reason="BAD_REQUEST", metadata={"param": param})


def _content(content: Any, index: int) -> list[route_service_pb2.ContentPart]:
    if isinstance(content, str):
        return [route_service_pb2.ContentPart(text=content)]
    if not isinstance(content, list):
        raise _bad("message content must be a string or a list of parts", f"messages[{index}]")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(route_service_pb2.ContentPart(text=str(part.get("text", ""))))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise _bad("image_url parts need image_url.url", f"messages[{index}].content")
            parts.append(route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(url=url)))
        else:
            raise _bad(f"unsupported content part type {kind!r} (use text or image_url)",
                       f"messages[{index}].content")  # fmt: skip
    return parts


def to_generate_request(
    body: Any, default_model: str, request_id: str | None = None
) -> route_service_pb2.GenerateRequest:
    """Validate a chat-completions body and convert it; ``request_id`` (the X-Request-Id header)
    names the request in every hop and trace, a fresh one is made when it is None."""
    if request_id is not None and not REQUEST_ID.fullmatch(request_id):
        raise _bad("X-Request-Id must be 1-128 letters, digits or . _ : -", "X-Request-Id")
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "body")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    chat = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise _bad("each message needs a role and content", f"messages[{index}]")
        chat.append(route_service_pb2.ChatMessage(role=str(message["role"]),
                                                  content=_content(message.get("content"), index)))
    stop = body.get("stop") or []
    sampling = generation_pb2.SamplingParams(
        max_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 16),
        temperature=float(body.get("temperature") or 0.0), top_p=float(body.get("top_p") or 1.0),
        stop=[stop] if isinstance(stop, str) else list(stop),
        # NOTE: vLLM's extensions of the OpenAI API, sent by vLLM's benchmarks and clients.
        top_k=max(0, int(body.get("top_k") or 0)), ignore_eos=bool(body.get("ignore_eos")),
        stop_token_ids=[int(t) for t in body.get("stop_token_ids") or []],
    )  # fmt: skip
    if body.get("seed") is not None:
        sampling.seed = int(body["seed"])
    return route_service_pb2.GenerateRequest(
        request_id=request_id or uuid.uuid4().hex, model=body.get("model") or default_model,
        messages=chat, sampling=sampling)  # fmt: skip


def error_body(err: Exception) -> tuple[int, dict[str, Any]]:
    """HTTP status and OpenAI-style error object for ``err``."""
    if not isinstance(err, EpdError):
        return 500, {"error": {"message": "internal server error", "type": "server_error",
                               "param": None, "code": "INTERNAL"}}  # fmt: skip
    status = HTTP_STATUS.get(err.code, 500)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, {"error": {"message": err.message, "type": kind,
                              "param": err.metadata.get("param"), "code": err.reason}}


def completion(request_id: str, model: str, text: str, finish: int,
               usage: generation_pb2.Usage | None) -> dict[str, Any]:  # fmt: skip
    """A non-streamed chat.completion object."""
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion",
            "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": FINISH.get(finish, "stop"),
                                         "message": {"role": "assistant", "content": text}}],
            "usage": usage_json(usage)}  # fmt: skip


def chunk(request_id: str, model: str, delta: dict[str, str], finish: int | None,
          usage: generation_pb2.Usage | None = None) -> dict[str, Any]:  # fmt: skip
    """One chat.completion.chunk (an empty choices list with usage for the usage chunk)."""
    choices = [] if usage is not None else [
        {"index": 0, "delta": delta, "finish_reason": FINISH.get(finish) if finish else None}]
    body: dict[str, Any] = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk",
                            "created": int(time.time()), "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage_json(usage)
    return body


def usage_json(usage: generation_pb2.Usage | None) -> dict[str, int]:
    """OpenAI usage object."""
    prompt = usage.prompt_tokens if usage else 0
    completion_tokens = usage.completion_tokens if usage else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}
