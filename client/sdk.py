"""Python SDK for epd's RouteService.

    async with AsyncEpdClient("127.0.0.1:50050") as client:
        async for chunk in client.stream([user("What is in this picture?", image="cat.png")]):
            print(chunk.text, end="", flush=True)

Images may be paths, bytes, PIL images or URLs (http(s) or data:). Errors raise
``EpdClientError`` with the status code and the server's ErrorInfo reason.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from PIL import Image

from epd.client.errors import EpdClientError
from epd.server.common.channels import create_channel
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc

ImageLike = str | Path | bytes | Image.Image


@dataclass(frozen=True, slots=True)
class Picture:
    """An image part of a message."""

    source: ImageLike


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn: role and an ordered list of text strings and pictures."""

    role: str
    parts: tuple[str | Picture, ...]


def user(text: str, *, image: ImageLike | None = None,
         images: Sequence[ImageLike] = ()) -> Message:  # fmt: skip
    """A user turn: its images first (as chat templates expect), then the text."""
    pictures = ([image] if image is not None else []) + list(images)
    return Message("user", (*(Picture(p) for p in pictures), text))


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of the answer; the last one has ``finish_reason`` and ``usage``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


def media_item(source: ImageLike) -> multimodal_pb2.MediaItem:
    """A MediaItem for a path, bytes, PIL image or URL."""
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


def build_request(messages: Sequence[Message], *, model: str = "", max_tokens: int = 64,
                  temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                  seed: int | None = None, stop: Sequence[str] = (), ignore_eos: bool = False,
                  request_id: str = "") -> route_service_pb2.GenerateRequest:  # fmt: skip
    """The GenerateRequest for ``messages`` and sampling settings."""
    chat = []
    for message in messages:
        content = [route_service_pb2.ContentPart(image=media_item(part.source))
                   if isinstance(part, Picture) else route_service_pb2.ContentPart(text=str(part))
                   for part in message.parts]  # fmt: skip
        chat.append(route_service_pb2.ChatMessage(role=message.role, content=content))
    sampling = generation_pb2.SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                             top_p=top_p, top_k=top_k, stop=list(stop),
                                             ignore_eos=ignore_eos)  # fmt: skip
    if seed is not None:
        sampling.seed = seed
    return route_service_pb2.GenerateRequest(request_id=request_id, model=model, messages=chat,
                                             sampling=sampling)  # fmt: skip


class AsyncEpdClient:
    """Async client of one route endpoint (host:port). Use as an async context manager."""

    def __init__(self, endpoint: str, *, auth_token: str | None = None,
                 tls_ca_file: str | None = None,
                 timeout_s: float | None = 300.0) -> None:  # fmt: skip
        self._channel = create_channel(endpoint, auth_token=auth_token, tls_ca_file=tls_ca_file)
        self._stub = route_service_pb2_grpc.RouteServiceStub(self._channel)
        self.timeout_s = timeout_s

    async def __aenter__(self) -> AsyncEpdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def stream(self, messages: Sequence[Message], *,
                     metadata: Sequence[tuple[str, str]] = (),
                     **sampling: Any) -> AsyncIterator[Chunk]:  # fmt: skip
        """Stream the answer to ``messages`` (sampling keywords as in ``build_request``)."""
        request = build_request(messages, **sampling)
        try:
            call = self._stub.Generate(request, timeout=self.timeout_s,
                                       metadata=tuple(metadata) or None)
            async for response in call:
                yield _chunk(response)
        except grpc.aio.AioRpcError as e:
            raise EpdClientError.from_rpc_error(e) from None

    async def generate(self, messages: Sequence[Message], **sampling: Any) -> Chunk:
        """The whole answer as one chunk."""
        texts, tokens, last = [], [], Chunk("", [])
        async for chunk in self.stream(messages, **sampling):
            texts.append(chunk.text)
            tokens.extend(chunk.token_ids)
            last = chunk
        return Chunk("".join(texts), tokens, last.finish_reason, last.usage)

    async def list_models(self) -> list[str]:
        """Ids of the models the deployment serves."""
        try:
            reply = await self._stub.ListModels(route_service_pb2.ListModelsRequest(), timeout=10)
        except grpc.aio.AioRpcError as e:
            raise EpdClientError.from_rpc_error(e) from None
        return [model.id for model in reply.models]


def _chunk(response: route_service_pb2.GenerateResponse) -> Chunk:
    reason = None
    if response.finish_reason:
        reason = generation_pb2.FinishReason.Name(response.finish_reason)
        reason = reason.removeprefix("FINISH_REASON_").lower()
    usage = {}
    if response.HasField("usage"):
        usage = {"prompt_tokens": response.usage.prompt_tokens,
                 "completion_tokens": response.usage.completion_tokens,
                 "cached_prompt_tokens": response.usage.cached_prompt_tokens}  # fmt: skip
    return Chunk(response.text, list(response.token_ids), reason, usage)
