"""Route -> scheduler -> encoder -> two prefill+decode workers (transformers engine) in one
process over real gRPC. The worker streaming a request is stopped abruptly after its first
tokens (its server ends every call at once, as a worker that dies or drains past its grace): the
client's one stream equals an uninterrupted run's, token for token, and nothing stays leased."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.reference import ReferenceEngine
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.prefill.app import PrefillApp, PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.pictures import picture, png

MAX_TOKENS = 96


@pytest.fixture(scope="module")
async def deployment(tiny_model_dir) -> AsyncIterator[dict[str, Any]]:
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    encoder = await build_encode_server(
        EncodeConfig(tiny_model_dir, model_id="tiny", scheduler=endpoint, worker_id="enc0")
    )
    engines = [await TransformersEngine.start(tiny_model_dir, model_id="tiny") for _ in range(2)]
    workers = [
        await build_prefill_server(
            PrefillConfig(tiny_model_dir, worker_id=f"pd{i}", scheduler=endpoint), engine
        )
        for i, engine in enumerate(engines)
    ]
    route = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny"))
    async with create_channel(endpoint) as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        for _ in range(1200):  # NOTE: up to a minute on a loaded machine
            listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
            if len(listing.workers) == 3:
                break
            await asyncio.sleep(0.05)
        assert len(listing.workers) == 3, listing
    channel = create_channel(f"127.0.0.1:{route.port}")
    yield {
        "stub": route_service_pb2_grpc.RouteServiceStub(channel),
        "encoder": encoder,
        "workers": workers,
        "route": route,
    }
    await channel.close()
    await route.stop()
    for worker in workers:
        await worker.stop()
    for engine in engines:
        await engine.close()
    await encoder.stop()
    await scheduler.drain_and_stop(0)


def chat(seed: int) -> route_service_pb2.GenerateRequest:
    image = route_service_pb2.ContentPart(
        image=multimodal_pb2.MediaItem(data=png(picture(seed, 96, 64)))
    )
    text = route_service_pb2.ContentPart(text="describe this picture")
    return route_service_pb2.GenerateRequest(
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=[image, text])],
        sampling=generation_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
    )


def serving_of(workers: list[PrefillApp]) -> Callable[[], list[PrefillApp]]:
    """Record which workers started a generation; returns a reader of that list."""
    started: list[PrefillApp] = []
    for app in workers:
        generate = app.worker.generate

        def recording(*args: Any, _app: PrefillApp = app, _generate: Any = generate) -> Any:
            started.append(_app)
            return _generate(*args)

        app.worker.generate = recording  # type: ignore[method-assign]
    return lambda: list(started)


async def test_a_worker_stopped_mid_stream_is_replaced_without_a_seam(
    deployment, tiny_model_dir
) -> None:
    stub, workers = deployment["stub"], deployment["workers"]
    expected = ReferenceEngine(tiny_model_dir).generate(
        [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "describe this picture"}],
            }
        ],
        [picture(5, 96, 64)],
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
    )
    started = serving_of(workers)
    responses = []
    async for response in stub.Generate(chat(5)):
        responses.append(response)
        if len(responses) == 2:
            [first] = started()
            await first.server.grpc_server.stop(0)
    tokens = [t for r in responses for t in r.token_ids]
    assert len(started()) == 2 and started()[1] is not started()[0]
    assert len(tokens) == MAX_TOKENS
    assert tokens == expected.token_ids
    assert "".join(r.text for r in responses) == expected.text
    assert responses[-1].usage.completion_tokens == MAX_TOKENS
    assert responses[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    await asyncio.sleep(0.2)
    assert deployment["encoder"].worker.plane.held() == []
    assert deployment["route"].router.plane.held() == []
