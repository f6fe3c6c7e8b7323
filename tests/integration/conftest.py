"""Session engines for the integration tests: one vLLM KV producer and one KV consumer of the
tiny model (in-process AsyncLLMs, each with its EngineCore child), started together once for
every test that needs a vLLM engine in-process."""

from __future__ import annotations

import asyncio

import pytest

KV_CACHE_BYTES = 96 << 20


@pytest.fixture(scope="session")
async def engines(tiny_model_dir):
    """(producer, consumer): the producer also serves whole generations (E/PD, EPD)."""
    from epd.server.engine.vllm_engine import VllmEngine, VllmOptions

    def options(role: str) -> VllmOptions:
        return VllmOptions(kv_role=role, kv_cache_bytes=KV_CACHE_BYTES, max_model_len=2048)

    producer, consumer = await asyncio.gather(
        VllmEngine.start(tiny_model_dir, model_id="tiny", options=options("kv_producer")),
        VllmEngine.start(tiny_model_dir, model_id="tiny", options=options("kv_consumer")),
    )
    yield producer, consumer
    await asyncio.gather(producer.close(), consumer.close())
