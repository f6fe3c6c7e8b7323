"""Every supported family in E/PD on vLLM and on the transformers engine, in one process over real
gRPC: text around two images of different sizes, answered token for token as transformers'
generate answers on the same checkpoint. (The default family's full topology matrix is in
tests/integration/engine/test_pd_vllm.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.reference import ReferenceEngine
from epd.server.models.registry import FAMILIES
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.families import skip_unless_run
from tests.pictures import picture, png

NUM_TOKENS = 12
ENGINES = ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)]


async def start_engine(name: str, model_dir: Path) -> Any:
    if name == "vllm":
        from epd.server.engine.vllm_engine import VllmEngine

        return await VllmEngine.start(model_dir, model_id="m")
    from epd.server.engine.transformers_engine import TransformersEngine

    return await TransformersEngine.start(model_dir, model_id="m")


async def e_pd_answer(
    model_dir: Path, engine_name: str, request: route_service_pb2.GenerateRequest
) -> list[int]:
    """Start scheduler, an encoder, a prefill+decode worker and a route; ask; stop."""
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    encoder = await build_encode_server(
        EncodeConfig(model_dir, model_id="m", scheduler=endpoint, worker_id="enc0")
    )
    engine = await start_engine(engine_name, model_dir)
    prefill = await build_prefill_server(PrefillConfig(model_dir, scheduler=endpoint), engine)
    route = await build_route_server(RouteConfig(model_dir, endpoint, "m"))
    try:
        async with create_channel(endpoint) as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            for _ in range(200):
                listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
                if len(listing.workers) == 2:
                    break
                await asyncio.sleep(0.05)
        async with create_channel(f"127.0.0.1:{route.port}") as channel:
            answers = route_service_pb2_grpc.RouteServiceStub(channel).Generate(request)
            tokens = [t async for r in answers for t in r.token_ids]
        assert encoder.plane.held() == []
        return tokens
    finally:
        await route.stop()
        await prefill.stop()
        await engine.close()
        await encoder.stop()
        await scheduler.drain_and_stop(0)


@pytest.fixture(params=[family.name for family in FAMILIES])
async def family_dir(
    request: pytest.FixtureRequest, tiny_family_dir: Callable[[str], Path]
) -> AsyncIterator[Path]:
    skip_unless_run(request, request.param)
    yield tiny_family_dir(request.param)


@pytest.mark.parametrize("engine_name", ENGINES)
async def test_e_pd_equals_transformers_for_every_family(
    family_dir: Path, engine_name: str
) -> None:
    images = [picture(11, 96, 64), picture(12, 60, 90)]
    parts = [
        route_service_pb2.ContentPart(text="first"),
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(images[0]))),
        route_service_pb2.ContentPart(text="then"),
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(images[1]))),
        route_service_pb2.ContentPart(text="compare them"),
    ]
    request = route_service_pb2.GenerateRequest(
        request_id="families-1",
        model="m",
        messages=[route_service_pb2.ChatMessage(role="user", content=parts)],
        sampling=generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True),
    )
    tokens = await e_pd_answer(family_dir, engine_name, request)
    content = [
        {"type": "text", "text": "first"},
        {"type": "image"},
        {"type": "text", "text": "then"},
        {"type": "image"},
        {"type": "text", "text": "compare them"},
    ]
    expected = ReferenceEngine(family_dir).generate(
        [{"role": "user", "content": content}], images, max_tokens=NUM_TOKENS, ignore_eos=True
    )
    assert tokens == expected.token_ids
