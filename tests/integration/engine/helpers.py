"""Request factories for the engine tests: pictures, chats, prompts with embeddings or media."""

from __future__ import annotations

from typing import Any

from PIL import Image

from epd.common.channels import create_channel
from epd.server.engine.base import Engine
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2, multimodal_pb2
from tests.pictures import png


def chat(num_images: int, text: str) -> list[dict[str, object]]:
    parts: list[dict[str, str]] = [{"type": "image"} for _ in range(num_images)]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def prompt_tokens(oracle, num_images: int, text: str) -> list[int]:
    reference, _ = oracle
    rendered = reference.render(chat(num_images, text))
    return list(reference.processor.tokenizer(rendered)["input_ids"])


def embedded_prompt(
    oracle, producer: DataPlane, images: list[Image.Image], text: str
) -> generation_pb2.Prompt:
    """A Prompt whose images are the encoder's embeddings, put in ``producer``'s data plane."""
    _, encoder = oracle
    inputs = []
    for i, image in enumerate(images):
        embeddings, grid = encoder.encode([image])[0]
        inputs.append(
            multimodal_pb2.ImageInput(
                mm_hash=f"{text}-{i}-{image.size}",
                grid=multimodal_pb2.ImageGrid(t=grid[0], h=grid[1], w=grid[2]),
                embeddings=producer.put(embeddings, producer.host_id),
            )
        )
    return generation_pb2.Prompt(token_ids=prompt_tokens(oracle, len(images), text), images=inputs)


def media_prompt(oracle, images: list[Image.Image], text: str) -> generation_pb2.Prompt:
    """A Prompt whose images are PNG bytes (no grid: the worker encodes them itself)."""
    inputs = []
    for image in images:
        inputs.append(multimodal_pb2.ImageInput(media=multimodal_pb2.MediaItem(data=png(image))))
    return generation_pb2.Prompt(token_ids=prompt_tokens(oracle, len(images), text), images=inputs)


def expected_tokens(oracle, images: list[Image.Image], text: str, num_tokens: int) -> list[int]:
    reference, _ = oracle
    return reference.generate(
        chat(len(images), text), images, max_tokens=num_tokens, ignore_eos=True
    ).token_ids


def release(producer: DataPlane, prompt: generation_pb2.Prompt) -> None:
    producer.release([i.embeddings.lease_id for i in prompt.images if i.HasField("embeddings")])


class Stubs:
    """Servers over the session engines (``producer``, ``consumer``) and stubs to call them."""

    def __init__(self, engines: tuple[Engine, Engine]) -> None:
        self.producer, self.consumer = engines
        self.apps: list[Any] = []
        self.channels: list[Any] = []

    async def serve(self, app: Any, stub_class: Any) -> Any:
        """A ``stub_class`` stub over a channel to ``app``; ``close`` stops both."""
        self.apps.append(app)
        self.channels.append(create_channel(f"127.0.0.1:{app.port}"))
        return stub_class(self.channels[-1])

    async def close(self) -> None:
        """Close the channels, stop the servers (deregistering them). Idempotent."""
        channels, apps, self.channels, self.apps = self.channels, self.apps, [], []
        for channel in channels:
            await channel.close()
        for app in apps:
            await app.stop()
