"""Tenants apart in the real caches: through the route, encoders and vLLM (the session's engine),
a request repeated with the same cache_salt hits the encoder's cache and vLLM's prefix cache,
while the same request with another cache_salt (another tenant) hits neither."""

from __future__ import annotations

from typing import Any

import pytest

from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
from tests.integration.e2e.route_epd_deployment import deployment_fixture
from tests.pictures import picture, png

pytestmark = pytest.mark.vllm
deployment = deployment_fixture("module")

# NOTE: over two of vLLM's 128-token CPU blocks, so a repeat finds whole blocks cached
QUESTION = "list every colour, shape and object you can see in this picture, in order " * 12


def request(cache_salt: str) -> route_service_pb2.GenerateRequest:
    parts = [
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(picture(9, 64, 64)))),
        route_service_pb2.ContentPart(text=QUESTION),
    ]
    return route_service_pb2.GenerateRequest(
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=parts)],
        sampling=generation_pb2.SamplingParams(max_tokens=2, cache_salt=cache_salt),
    )


async def ask(deployment: Any, cache_salt: str) -> tuple[int, int, int]:
    """(prompt tokens vLLM found cached, encoder cache hits, encoder cache misses) of one
    request with ``cache_salt``."""
    stub, encoders, _, _ = deployment
    before = [(e.worker.cache.num_hits, e.worker.cache.num_misses) for e in encoders]
    responses = [r async for r in stub.Generate(request(cache_salt))]
    after = [(e.worker.cache.num_hits, e.worker.cache.num_misses) for e in encoders]
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    misses = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return responses[-1].usage.cached_prompt_tokens, hits, misses


async def test_one_tenant_hits_its_own_entries_and_not_another_s(deployment) -> None:
    cached, hits, _ = await ask(deployment, "tenant-a")
    assert cached == 0 and hits == 0
    cached, hits, _ = await ask(deployment, "tenant-a")
    assert cached >= 128 and hits == 1, "the same tenant hits vLLM's prefix cache and the encoder's"
    cached, hits, misses = await ask(deployment, "tenant-b")
    assert cached == 0 and hits == 0 and misses >= 1, "another tenant hits neither"
