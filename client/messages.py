"""Chat messages, sampling options and answer chunks of the SDK, and their protobuf forms."""

from __future__ import annotations

import io
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Unpack

from PIL import Image

from epd.client.options import (
    RequestOptions,
    answer_fields,
    check_options,
    request_fields,
    sampling_of,
)
from epd.client.tools import ToolCall, add_tool_fields, joined_calls, to_tool_calls
from epd.common.generation import finish_reason_name
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

ImageLike = str | Path | bytes | Image.Image
# URL schemes the server fetches (in any case, as URLs allow).
SERVER_SCHEMES = frozenset({"http", "https", "data"})
# A URL's scheme (RFC 3986): a letter, then letters, digits, + - or ., before the first colon.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_IMAGE_FORMS = (
    "an image is bytes, a PIL image, a Path or path string of a file, a file: URL, "
    "or an http(s) or data: URL"
)
POLICIES = {
    "": scheduler_pb.ENCODER_POLICY_UNSPECIFIED,
    "per_image": scheduler_pb.ENCODER_POLICY_PER_IMAGE,
    "per_request": scheduler_pb.ENCODER_POLICY_PER_REQUEST,
    "adaptive": scheduler_pb.ENCODER_POLICY_ADAPTIVE,
}


@dataclass(frozen=True, slots=True)
class Picture:
    """An image part of a message: encoded bytes, a PIL image, a local file (a ``Path``, a
    string without a URL scheme, or a ``file:`` URL: read here, on the client), or an http(s)
    or data: URL (sent as it is; the server fetches it under its media rules). Schemes are read
    in any case; a string with any other scheme is refused (pass a ``Path`` for a file whose
    name holds a colon)."""

    source: ImageLike


@dataclass(frozen=True, slots=True)
class Video:
    """A video part of a message (mp4, mov, webm or matroska): encoded bytes, a local file or a
    URL, read or sent as a ``Picture``'s source is; the route decodes it and samples its frames
    as the model's video processor does."""

    source: str | Path | bytes


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn: ``role`` ("system", "user", "assistant", "tool") and its parts in order;
    an assistant turn's ``tool_calls`` (whole) and ``reasoning``, a tool turn's
    ``tool_call_id`` (the call whose result it is), as an OpenAI chat's messages carry them."""

    role: str
    parts: tuple[str | Picture | Video, ...]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning: str = ""


def user(
    text: str,
    *,
    image: ImageLike | None = None,
    images: Sequence[ImageLike] = (),
    video: str | Path | bytes | None = None,
    videos: Sequence[str | Path | bytes] = (),
) -> Message:
    """A user turn: its images first, then its videos (as chat templates expect), then the
    text."""
    pictures = ([image] if image is not None else []) + list(images)
    clips = ([video] if video is not None else []) + list(videos)
    return Message("user", (*(Picture(p) for p in pictures), *(Video(v) for v in clips), text))


def system(text: str) -> Message:
    """A system turn."""
    return Message("system", (text,))


def assistant(
    text: str = "", *, tool_calls: Sequence[ToolCall] = (), reasoning: str = ""
) -> Message:
    """An assistant turn (an earlier answer, for multi-turn chats): its text, the tools it
    called (an answer's ``Chunk.tool_calls``; no text needed then) and its reasoning."""
    parts = (text,) if text or not tool_calls else ()
    return Message("assistant", parts, tuple(tool_calls), reasoning=reasoning)


def tool(text: str, *, call_id: str) -> Message:
    """A tool's result: ``text``, for the call ``call_id`` (its ``ToolCall.id``)."""
    return Message("tool", (text,), tool_call_id=call_id)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one completion (the prompt's included)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A token and its log probability at one position of the answer; ``rank`` 1 is the most
    likely; ``token`` its text as the engine decoded it there ("" where it did not)."""

    token_id: int
    logprob: float
    rank: int
    token: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of the answer: text delta and token ids; the last one of a completion has
    ``finish_reason`` ("stop", "length" or "abort") and ``usage``. ``logprobs``: for each token,
    the generated one first, then the most likely (when ``logprobs`` was asked for).
    ``index``: which of the request's ``n`` completions. ``prompt_logprobs``: on a completion's
    first chunk, for each prompt token, that token first, then the most likely (the first
    position empty: nothing precedes it), when ``prompt_logprobs`` was asked for. Where the
    route has a reasoning parser, ``reasoning`` is the model's reasoning and ``text`` the rest
    of the answer; where it has a tool parser and the request tools, ``tool_calls`` are the
    calls the model made (parts of them in a stream: see ``ToolCall``), whose text is not in
    ``text``, and the completion that made them ends with "tool_calls". ``prompt_text``: on a
    completion's first chunk, the prompt as the chat template wrote it, when
    ``return_prompt_text`` was asked for ("" otherwise); ``prompt_token_ids``: likewise, the
    prompt's token ids as the engine holds them, when ``return_token_ids`` was asked for
    (empty otherwise)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    usage: Usage | None = None
    request_id: str = ""
    logprobs: list[list[Candidate]] = field(default_factory=list)
    index: int = 0
    prompt_logprobs: list[list[Candidate]] = field(default_factory=list)
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_text: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)


def local_path(source: str | Path) -> Path | None:
    """The client's file ``source`` names (see ``Picture``), or None for a URL the server
    fetches; ValueError for a string with another scheme or a file: URL of another host."""
    if isinstance(source, Path):
        return source
    match = _SCHEME.match(source)
    scheme = match.group(1).lower() if match else ""
    if scheme in SERVER_SCHEMES:
        return None
    if not scheme:
        return Path(source)
    parts = urllib.parse.urlsplit(source)
    if scheme != "file" or parts.netloc not in ("", "localhost"):
        raise ValueError(f"cannot send image {_shown(source)!r}: {_IMAGE_FORMS}")
    return Path(urllib.parse.unquote(parts.path))


def media_item(source: ImageLike) -> multimodal_pb2.MediaItem:
    """A MediaItem for ``source`` (see ``Picture``): local files are read here; ValueError for a
    source that is none of the forms, or a file that does not exist."""
    if isinstance(source, Image.Image):
        buffer = io.BytesIO()
        source.save(buffer, format="PNG")
        return multimodal_pb2.MediaItem(data=buffer.getvalue())
    if isinstance(source, bytes):
        return multimodal_pb2.MediaItem(data=source)
    path = local_path(source)
    if path is None:
        return multimodal_pb2.MediaItem(url=str(source))
    if not path.is_file():
        raise ValueError(f"no image file {_shown(str(path))!r}: {_IMAGE_FORMS}")
    return multimodal_pb2.MediaItem(data=path.read_bytes())


def _content_part(part: str | Picture | Video) -> route_service_pb2.ContentPart:
    if isinstance(part, Picture):
        return route_service_pb2.ContentPart(image=media_item(part.source))
    if isinstance(part, Video):
        return route_service_pb2.ContentPart(video=media_item(part.source))
    return route_service_pb2.ContentPart(text=str(part))


def _shown(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


def build_request(
    messages: Sequence[Message], **options: Unpack[RequestOptions]
) -> route_service_pb2.GenerateRequest:
    """The GenerateRequest for ``messages`` and ``options`` (``RequestOptions``: vLLM's sampling
    options, a structured output, the multimodal options, tools, the answer options, the encoder
    policy, the request id). Images: see ``Picture``."""
    check_options(options)
    fields = request_fields(options)
    if fields["encoder_policy"] not in POLICIES:
        raise ValueError(f"encoder_policy must be one of {sorted(POLICIES)}")
    chat = [_chat_message(message) for message in messages]
    request = route_service_pb2.GenerateRequest(
        request_id=fields["request_id"],
        model=fields["model"],
        messages=chat,
        sampling=sampling_of(options),
        encoder_policy=POLICIES[fields["encoder_policy"]],
        **answer_fields(options),
    )
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        if options.get(name) is not None:
            getattr(request, name).update(options[name])  # type: ignore[literal-required]
    for document in options.get("documents") or []:
        request.documents.add().update(document)
    add_tool_fields(request, options)
    return request


def _chat_message(message: Message) -> route_service_pb2.ChatMessage:
    return route_service_pb2.ChatMessage(
        role=message.role,
        content=[_content_part(part) for part in message.parts],
        tool_calls=[
            route_service_pb2.ToolCall(id=call.id, name=call.name, arguments=call.arguments)
            for call in message.tool_calls
        ],
        tool_call_id=message.tool_call_id,
        reasoning=message.reasoning,
    )


def to_chunk(response: route_service_pb2.GenerateResponse) -> Chunk:
    """The SDK's view of one GenerateResponse."""
    usage = None
    if response.HasField("usage"):
        usage = Usage(
            response.usage.prompt_tokens,
            response.usage.completion_tokens,
            response.usage.cached_prompt_tokens,
        )
    return Chunk(
        response.text,
        list(response.token_ids),
        finish_reason_name(response.finish_reason),
        usage,
        response.request_id,
        _candidates(response.logprobs),
        response.index,
        _candidates(response.prompt_logprobs),
        response.reasoning,
        to_tool_calls(response.tool_calls),
        response.prompt_text,
        list(response.prompt_token_ids),
    )


def _candidates(positions: Sequence[generation_pb2.TokenLogprobs]) -> list[list[Candidate]]:
    return [
        [Candidate(c.token_id, c.logprob, c.rank, c.token) for c in position.candidates]
        for position in positions
    ]


def join(chunks: Sequence[Chunk]) -> Chunk:
    """The whole answer of one completion as one chunk."""
    last = chunks[-1] if chunks else Chunk("", [])
    return Chunk(
        "".join(c.text for c in chunks),
        [t for c in chunks for t in c.token_ids],
        last.finish_reason,
        last.usage,
        last.request_id,
        [position for c in chunks for position in c.logprobs],
        last.index,
        [position for c in chunks for position in c.prompt_logprobs],
        "".join(c.reasoning for c in chunks),
        joined_calls([call for c in chunks for call in c.tool_calls]),
        next((c.prompt_text for c in chunks if c.prompt_text), ""),
        next((c.prompt_token_ids for c in chunks if c.prompt_token_ids), []),
    )


def completions(chunks: Sequence[Chunk]) -> list[Chunk]:
    """Each completion's whole answer (``n`` of them), by index."""
    by_index: dict[int, list[Chunk]] = {}
    for chunk in chunks:
        by_index.setdefault(chunk.index, []).append(chunk)
    return [join(by_index[index]) for index in sorted(by_index)]
