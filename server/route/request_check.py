"""The checks of a ``ChatRequest`` before any work (tokenising, fetching images), no I/O.

The OpenAI HTTP door has vLLM's ``ChatCompletionRequest`` judge a body (types, ranges, its
``to_sampling_params``: ``openai_schema``), then ``check_content`` judges what vLLM leaves to
epd: the model's name, the chat (roles, parts, sizes against ``RequestLimits``) and epd's bounds
on the sampling's lists. The gRPC door's ``GenerateRequest`` (``request.from_proto``) comes with
none of vLLM's judging: ``check_request`` judges it whole, its id, encoder policy and
``max_tokens`` against the model's context, ``check_content``, and its sampling as the engine
will judge it (``sampling.check_sampling``). A refusal is an ``InvalidArgument`` whose ``param``
metadata names the field (``messages[1].content[0].image``, ``max_tokens``): a 400 over HTTP,
INVALID_ARGUMENT over gRPC.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from epd.common.flags import flag
from epd.common.generation import SAMPLING_DEFAULTS
from epd.server.route.request import ChatMessage, ChatRequest, ImageSource, bad, check_name
from epd.server.route.sampling import beam_step_sampling, check_sampling
from epd.v1 import generation_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

# Roles a chat may hold -> the role the chat templates know ("developer" is OpenAI's newer name
# for "system").
ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# Bounds on a request's sampling lists (vLLM's engine keeps top_k in an int32 tensor).
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1024
MAX_LIST_ITEMS = 1024
INT32_MAX = 2**31 - 1
MAX_CHOICES = 128
# Client-chosen request ids (the X-Request-Id header vLLM's clients and benchmarks send).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Sizes a request may have, checked before any work (tokenising, fetching images)."""

    max_messages: int = 2048
    max_parts_per_message: int = 256
    # Text characters over all messages: refuses text far beyond any context untokenised.
    max_prompt_chars: int = field(
        default=1 << 20,
        metadata=flag(
            "text characters one request's messages may hold, refused before tokenising, over "
            "HTTP and gRPC",
            env="EPD_MAX_PROMPT_CHARS",
        ),
    )
    max_images: int = field(
        default=16,
        metadata=flag("images one request may hold, over HTTP and gRPC", env="EPD_MAX_IMAGES"),
    )
    # The model's context in tokens: max_tokens above it is refused, and a request without
    # max_tokens gets it (the engine stops at the end of the context). None: unchecked, and
    # SAMPLING_DEFAULTS.max_tokens.
    max_context_tokens: int | None = None

    def with_context(self, num_tokens: int | None) -> RequestLimits:
        """These limits with the model's context ``num_tokens`` where they name none."""
        if self.max_context_tokens is not None or num_tokens is None:
            return self
        return replace(self, max_context_tokens=num_tokens)


def check_request_id(request_id: str, param: str) -> None:
    """Refuse a request id that is not 1-128 letters, digits or . _ : -"""
    if not REQUEST_ID.fullmatch(request_id):
        raise bad(f"{param} must be 1-128 letters, digits or . _ : -", param)


def check_request(request: ChatRequest, limits: RequestLimits) -> None:
    """Refuse ``request`` whole (the gRPC door's, which no vLLM request model judged; the
    completions door's) unless every rule holds, then give it its defaults in place: each role
    its template name, an unset ``max_tokens`` the model's context."""
    check_request_id(request.request_id, "request_id")
    check_content(request, limits)
    if request.encoder_policy not in scheduler_pb.EncoderPolicy.values():
        raise bad(f"unknown encoder_policy {request.encoder_policy}", "encoder_policy")
    sampling = request.sampling
    context = limits.max_context_tokens
    if not sampling.max_tokens:
        sampling.max_tokens = context or SAMPLING_DEFAULTS.max_tokens
    elif context is not None and sampling.max_tokens > context:
        raise bad(
            f"max_tokens is {sampling.max_tokens} but the model's context is {context} tokens",
            "max_tokens",
        )
    if not request.use_beam_search:
        check_sampling(sampling)


def check_content(request: ChatRequest, limits: RequestLimits) -> None:
    """Refuse ``request`` for what no vLLM request model judges: its model's name, its chat
    (each role then named as templates know it) or completion's prompt, epd's bounds on its
    sampling's lists, and a beam search's steps (vLLM's beam search makes each step's sampling,
    which its ``BeamSearchParams`` does not judge)."""
    if request.model:
        check_name(request.model, "model")
    if request.prompt_token_ids is None:
        _check_chat(request.messages, limits)
    else:
        _check_prompt(request.prompt_token_ids, limits)
    _check_sizes(request.sampling)
    if request.use_beam_search:
        check_sampling(beam_step_sampling(request.sampling))


def _check_prompt(token_ids: list[int], limits: RequestLimits) -> None:
    """A completion's tokenised prompt: not empty, within the context."""
    if not token_ids:
        raise bad("the prompt is empty", "prompt")
    context = limits.max_context_tokens
    if context is not None and len(token_ids) >= context:
        raise bad(
            f"the prompt has {len(token_ids)} tokens; the model's context is {context}", "prompt"
        )


def _check_chat(messages: Sequence[ChatMessage], limits: RequestLimits) -> None:
    if not messages:
        raise bad("the chat has no messages", "messages", "EMPTY_CHAT")
    if len(messages) > limits.max_messages:
        raise bad(f"at most {limits.max_messages} messages", "messages", "LIMIT_EXCEEDED")
    num_chars = num_images = 0
    for index, message in enumerate(messages):
        chars, images = _check_message(message, f"messages[{index}]", limits)
        num_chars, num_images = num_chars + chars, num_images + images
    if num_chars > limits.max_prompt_chars:
        raise bad(
            f"the messages hold {num_chars} characters of text, the limit is "
            f"{limits.max_prompt_chars}",
            "messages",
            "LIMIT_EXCEEDED",
        )
    if num_images > limits.max_images:
        raise bad(f"at most {limits.max_images} images a request", "messages", "LIMIT_EXCEEDED")


def _check_message(message: ChatMessage, param: str, limits: RequestLimits) -> tuple[int, int]:
    """Check ``message`` and name its role as templates do; (text characters, images) in it."""
    if message.role not in ROLES:
        raise bad(
            "role must be system, developer, user, assistant or tool", f"{param}.role", "BAD_ROLE"
        )
    message.role = ROLES[message.role]
    if not message.parts and "tool_calls" not in message.template_fields:
        raise bad(f"a {message.role} message has no content", f"{param}.content", "EMPTY_MESSAGE")
    if len(message.parts) > limits.max_parts_per_message:
        raise bad(
            f"a message has at most {limits.max_parts_per_message} parts",
            f"{param}.content",
            "LIMIT_EXCEEDED",
        )
    num_chars = num_images = 0
    for index, part in enumerate(message.parts):
        if part.image is not None:
            _check_media(part.image, f"{param}.content[{index}].image")
            num_images += 1
        elif part.video is not None:
            _check_media(part.video, f"{param}.content[{index}].video")
        elif part.text is not None:
            num_chars += len(part.text)
        else:
            raise bad("a content part needs text, an image or a video", f"{param}.content[{index}]")
    return num_chars, num_images


def _check_media(source: ImageSource, param: str) -> None:
    if not (source.url or source.data):
        kind = param.rsplit(".", 1)[-1]
        raise bad(f"{kind} parts need a url or data", param, "BAD_MEDIA_ITEM")


def _check_sizes(sampling: generation_pb2.SamplingParams) -> None:
    """epd's bounds on what one request may ask of an engine, beyond vLLM's own checks."""
    if len(sampling.stop) > MAX_STOP_STRINGS:
        raise bad(f"stop holds at most {MAX_STOP_STRINGS} strings", "stop")
    for index, stop in enumerate(sampling.stop):
        if len(stop) > MAX_STOP_CHARS:
            raise bad(f"a stop string has at most {MAX_STOP_CHARS} characters", f"stop[{index}]")
    for name in ("stop_token_ids", "bad_words", "allowed_token_ids", "logit_bias"):
        if len(getattr(sampling, name)) > MAX_LIST_ITEMS:
            raise bad(f"{name} holds at most {MAX_LIST_ITEMS} items", name)
    if sampling.top_k > INT32_MAX:
        raise bad(f"top_k must be at most {INT32_MAX}", "top_k")
    if sampling.n > MAX_CHOICES:
        raise bad(f"n must be at most {MAX_CHOICES}", "n")
