"""Session engines for the integration tests: one vLLM KV producer and one KV consumer of the
tiny model (in-process AsyncLLMs, each with its EngineCore child), started together once for
every test that needs a vLLM engine in-process; and the same pair for another family's tiny
checkpoint (``family_engines``), started once for every module that asks for that family."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

KV_CACHE_BYTES = 96 << 20


async def start_pair(model_dir: Path) -> tuple[Any, Any]:
    """A KV producer and a KV consumer vLLM engine of ``model_dir``, started together."""
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

    def options(role: str) -> VllmOptions:
        return VllmOptions(kv_role=role, kv_cache_bytes=KV_CACHE_BYTES, max_model_len=2048)

    producer, consumer = await asyncio.gather(
        VllmEngine.start(model_dir, model_id="tiny", options=options("kv_producer")),
        VllmEngine.start(model_dir, model_id="tiny", options=options("kv_consumer")),
    )
    return producer, consumer


@pytest.fixture(scope="session")
async def engines(tiny_model_dir):
    """(producer, consumer): the producer also serves whole generations (E/PD, EPD)."""
    producer, consumer = await start_pair(tiny_model_dir)
    yield producer, consumer
    await asyncio.gather(producer.close(), consumer.close())


@pytest.fixture(scope="session")
async def family_engines(
    tiny_family_dir: Callable[[str], Path],
) -> AsyncIterator[Callable[[str], Awaitable[tuple[Any, Any]]]]:
    """``await family_engines(name)``: (producer, consumer) of the family's tiny checkpoint.
    One family's pair is held at a time (asking for another closes it), so modules that ask
    for the same family in turn (the video test, the families matrix) share one start."""
    held: dict[str, tuple[Any, Any]] = {}

    async def close_held() -> None:
        for pair in held.values():
            await asyncio.gather(pair[0].close(), pair[1].close())
        held.clear()

    async def pair_of(family: str) -> tuple[Any, Any]:
        if family not in held:
            await close_held()
            held[family] = await start_pair(tiny_family_dir(family))
        return held[family]

    yield pair_of
    await close_held()
