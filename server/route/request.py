"""The route's own request: what both doors make of a caller's chat (no I/O, no grpc).

The OpenAI HTTP door makes a ``ChatRequest`` of a JSON body (``openai_schema``), the gRPC door of
a ``GenerateRequest`` (``from_proto``); ``request_check`` then judges it (the same content
rules whichever door it came by), and the ``Router`` runs it. The request id is made here, once:
the caller's (the gRPC field, the X-Request-Id header), else a fresh one.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epd.common.errors import DeadlineExceeded, InvalidArgument
from epd.server.media.video_overrides import MediaKwargs
from epd.v1 import generation_pb2, route_service_pb2

if TYPE_CHECKING:
    from epd.server.route.tools_answer import AnswerParsing

MAX_NAME_CHARS = 256


def bad(message: str, param: str, reason: str = "BAD_REQUEST") -> InvalidArgument:
    """The error for a refused ``param`` (reported as the OpenAI error's ``param``)."""
    return InvalidArgument(message, reason=reason, metadata={"param": param})


def valid_unicode(value: str, param: str) -> str:
    """``value`` if it is valid Unicode (JSON's \\ud800 escapes decode to lone surrogates, which
    protobuf refuses to serialize)."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{param} holds a lone surrogate (invalid Unicode)", param) from None
    return value


def check_name(value: str, param: str) -> str:
    """A name (a model's, a user's) of at most ``MAX_NAME_CHARS`` valid characters."""
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
        raise bad(f"{param} must be a string of at most {MAX_NAME_CHARS} characters", param)
    return valid_unicode(value, param)


@dataclass(frozen=True, slots=True)
class ImageSource:
    """Where an image or a video comes from: a URL (http(s), data:, file:) or its encoded
    bytes."""

    url: str = ""
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class ChatPart:
    """One part of a message: text, an image or a video."""

    text: str | None = None
    image: ImageSource | None = None
    video: ImageSource | None = None


@dataclass(slots=True)
class ChatMessage:
    """One message of the chat; ``role`` becomes its chat-template name once checked."""

    role: str
    parts: list[ChatPart]
    # what the chat template gets beside role and content, as vLLM passes it: an assistant's
    # tool_calls (arguments as objects), a tool result's tool_call_id and its text as one
    # string (empty: none)
    template_fields: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ChatRequest:
    """One chat to answer; ``sampling`` is what the engines get (an unset ``max_tokens`` is given
    its default once checked)."""

    request_id: str
    model: str
    messages: list[ChatMessage]
    sampling: generation_pb2.SamplingParams = field(default_factory=generation_pb2.SamplingParams)
    # the scheduler's EncoderPolicy value (0: its default policy)
    encoder_policy: int = 0
    # keyword arguments for the chat template, as vLLM passes a request's (add_generation_prompt,
    # continue_final_message, documents, the request's chat_template_kwargs); empty: the
    # assistant's turn opened
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # the body's own chat template, used instead of the route's (vLLM's request chat_template,
    # accepted with --trust-request-chat-template; None: the route's)
    chat_template: str | None = None
    # a completion's prompt, tokenised: no messages, no chat template, no image (None: a chat)
    prompt_token_ids: list[int] | None = None
    # a completion's further prompts (a list of prompts): each is answered as a request of its
    # own with its n completions, numbered after those of the prompts before it
    more_prompts: list[list[int]] = field(default_factory=list)
    # the first chunk carries the prompt as the engine holds it (vLLM's return_token_ids)
    return_token_ids: bool = False
    # the first chunk carries the chat template's text (vLLM's return_prompt_text)
    return_prompt_text: bool = False
    # the prompt's tokens kept (vLLM's truncate_prompt_tokens, -1 already made the context's
    # bound; None: all) and the side cut (vLLM's truncation_side; None: vLLM's default, left)
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    # the tokenizer's special tokens added to the rendered chat's (vLLM's add_special_tokens)
    add_special_tokens: bool = False
    # the OpenAI door names logprob tokens ``token_id:N`` (vLLM's return_tokens_as_token_ids)
    tokens_as_ids: bool = False
    # the text a chat answer starts with (vLLM's echo: the last message's, when its role is the
    # answer's; "": none)
    echo: str = ""
    # either door streams a completion's tokens this many at a time, its first and last chunks
    # at once (vLLM's stream_interval)
    stream_interval: int = 1
    # the request's own mm_processor_kwargs and media_io_kwargs (vLLM's; the media loaders
    # check and apply them: video_overrides)
    media_kwargs: MediaKwargs = field(default_factory=MediaKwargs)
    # how either door splits the answer into content, reasoning and tool calls (vLLM's
    # parsers; None: the text is the content)
    answer_parsing: AnswerParsing | None = None
    # vLLM's use_beam_search: the answer is the best ``sampling.n`` beams (``beam_choices``),
    # ranked with vLLM's length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # tokens the answer has begun with, appended to the prompt once it is built and cut (a
    # beam's tokens so far: ``beam_choices``)
    answer_prefix: list[int] = field(default_factory=list)
    # the caller's identity where the door authenticates it (``common.auth.token_identity``),
    # which keeps its cache keys apart from other callers' ("": unauthenticated, shared keys)
    tenant: str = ""

    @property
    def images(self) -> list[ImageSource]:
        """The chat's images in order of appearance."""
        return [part.image for m in self.messages for part in m.parts if part.image is not None]

    @property
    def videos(self) -> list[ImageSource]:
        """The chat's videos in order of appearance."""
        return [part.video for m in self.messages for part in m.parts if part.video is not None]


class Deadline:
    """The time left of a request, handed to every hop as its own timeout."""

    def __init__(self, timeout_s: float | None) -> None:
        self._end = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        """Seconds left (None: no deadline); DeadlineExceeded once it has passed."""
        if self._end is None:
            return None
        left = self._end - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the request's deadline passed", reason="DEADLINE_EXCEEDED")
        return left


def new_request_id(given: str | None = None) -> str:
    """``given`` when the caller named the request, else a fresh id."""
    return given or uuid.uuid4().hex


def from_proto(request: route_service_pb2.GenerateRequest) -> ChatRequest:
    """The ``ChatRequest`` of a gRPC ``GenerateRequest`` (unchecked, but for image parts naming
    pixels: shared memory is the route's to name, never a caller's), its tool fields left to
    ``tools_proto.add_tools``."""
    messages = [
        ChatMessage(
            message.role,
            [_part(part, f"messages[{i}].content[{j}]") for j, part in enumerate(message.content)],
        )
        for i, message in enumerate(request.messages)
    ]
    return ChatRequest(
        new_request_id(request.request_id),
        request.model,
        messages,
        request.sampling,
        int(request.encoder_policy),
        stream_interval=max(request.stream_interval, 1),
        media_kwargs=MediaKwargs(
            _struct(request, "mm_processor_kwargs"), _struct(request, "media_io_kwargs")
        ),
    )


def _struct(request: route_service_pb2.GenerateRequest, name: str) -> dict[str, Any] | None:
    """The JSON object of ``request``'s Struct field ``name``; None when unset."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(getattr(request, name)) if request.HasField(name) else None


def _part(part: route_service_pb2.ContentPart, param: str) -> ChatPart:
    kind = part.WhichOneof("part")
    if kind == "text":
        return ChatPart(text=part.text)
    if kind is None:
        return ChatPart()
    item = part.video if kind == "video" else part.image
    for field_name in ("pixels", "video"):
        if item.HasField(field_name):
            raise bad(
                f"a media item's {field_name} are the route's to set",
                f"{param}.{kind}.{field_name}",
                "BAD_MEDIA_ITEM",
            )
    if item.image_settings:
        raise bad(
            "a media item's image settings are the route's to set: send mm_processor_kwargs",
            f"{param}.{kind}.image_settings",
            "BAD_MEDIA_ITEM",
        )
    source = ImageSource(item.url, item.data)
    return ChatPart(video=source) if kind == "video" else ChatPart(image=source)
