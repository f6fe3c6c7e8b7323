"""Chat messages, sampling options and answer chunks of the SDK, and their protobuf forms."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

ImageLike = str | Path | bytes | Image.Image
POLICIES = {
    "": scheduler_pb.ENCODER_POLICY_UNSPECIFIED,
    "per_image": scheduler_pb.ENCODER_POLICY_PER_IMAGE,
    "per_request": scheduler_pb.ENCODER_POLICY_PER_REQUEST,
    "adaptive": scheduler_pb.ENCODER_POLICY_ADAPTIVE,
}


@dataclass(frozen=True, slots=True)
class Picture:
    """An image part of a message: a file path, encoded bytes, a PIL image, or an http(s) or
    data: URL (the server fetches URLs under its media rules)."""

    source: ImageLike


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn: ``role`` ("system", "user", "assistant") and its parts in order."""

    role: str
    parts: tuple[str | Picture, ...]


def user(text: str, *, image: ImageLike | None = None, images: Sequence[ImageLike] = ()) -> Message:
    """A user turn: its images first (as chat templates expect), then the text."""
    pictures = ([image] if image is not None else []) + list(images)
    return Message("user", (*(Picture(p) for p in pictures), text))


def system(text: str) -> Message:
    """A system turn."""
    return Message("system", (text,))


def assistant(text: str) -> Message:
    """An assistant turn (an earlier answer, for multi-turn chats)."""
    return Message("assistant", (text,))


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of the answer: text delta and token ids; the last one has ``finish_reason``
    ("stop", "length" or "abort") and ``usage`` (prompt_tokens, completion_tokens,
    cached_prompt_tokens)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    request_id: str = ""


def media_item(source: ImageLike) -> multimodal_pb2.MediaItem:
    """A MediaItem for a path, bytes, PIL image or URL (files are read here, on the client)."""
    if isinstance(source, Image.Image):
        buffer = io.BytesIO()
        source.save(buffer, format="PNG")
        return multimodal_pb2.MediaItem(data=buffer.getvalue())
    if isinstance(source, bytes):
        return multimodal_pb2.MediaItem(data=source)
    text = str(source)
    if text.startswith(("http://", "https://", "data:")):
        return multimodal_pb2.MediaItem(url=text)
    return multimodal_pb2.MediaItem(data=Path(text).read_bytes())


def build_request(
    messages: Sequence[Message],
    *,
    model: str = "",
    max_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    encoder_policy: str = "",
    request_id: str = "",
) -> route_service_pb2.GenerateRequest:
    """The GenerateRequest for ``messages`` and these options.

    ``model`` empty: the deployment's only model. ``temperature`` 0: greedy. ``seed``: fixed
    seed for reproducible sampling. ``encoder_policy``: "per_image", "per_request", "adaptive"
    or "" (the deployment's default). ``request_id`` empty: the route makes one up.
    """
    if encoder_policy not in POLICIES:
        raise ValueError(f"encoder_policy must be one of {sorted(POLICIES)}")
    chat = []
    for message in messages:
        content = [
            route_service_pb2.ContentPart(image=media_item(part.source))
            if isinstance(part, Picture)
            else route_service_pb2.ContentPart(text=str(part))
            for part in message.parts
        ]
        chat.append(route_service_pb2.ChatMessage(role=message.role, content=content))
    sampling = generation_pb2.SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=list(stop),
        stop_token_ids=list(stop_token_ids),
        ignore_eos=ignore_eos,
    )
    if seed is not None:
        sampling.seed = seed
    return route_service_pb2.GenerateRequest(
        request_id=request_id,
        model=model,
        messages=chat,
        sampling=sampling,
        encoder_policy=POLICIES[encoder_policy],
    )


def to_chunk(response: route_service_pb2.GenerateResponse) -> Chunk:
    """The SDK's view of one GenerateResponse."""
    reason = None
    if response.finish_reason:
        reason = generation_pb2.FinishReason.Name(response.finish_reason)
        reason = reason.removeprefix("FINISH_REASON_").lower()
    usage = {}
    if response.HasField("usage"):
        usage = {
            "prompt_tokens": response.usage.prompt_tokens,
            "completion_tokens": response.usage.completion_tokens,
            "cached_prompt_tokens": response.usage.cached_prompt_tokens,
        }
    return Chunk(response.text, list(response.token_ids), reason, usage, response.request_id)


def join(chunks: Sequence[Chunk]) -> Chunk:
    """The whole answer as one chunk."""
    last = chunks[-1] if chunks else Chunk("", [])
    return Chunk(
        "".join(c.text for c in chunks),
        [t for c in chunks for t in c.token_ids],
        last.finish_reason,
        last.usage,
        last.request_id,
    )
