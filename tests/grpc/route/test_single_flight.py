"""Single flight across encoders, in process over real gRPC: many concurrent requests for one new
image, through the route, over two encoders (the tiny model's tower) and a prefill+decode worker
around a canned engine, run one tower once in the deployment; the scheduler learns which encoder
holds the image from the outcomes and its heartbeats, and sends the next request there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeApp, EncodeConfig, build_encode_server
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.engines import CannedEngine
from tests.pictures import picture, png

NUM_REQUESTS = 6


@dataclass
class Stack:
    route_port: int
    scheduler: scheduler_grpc.SchedulerServiceStub
    encoders: list[EncodeApp]

    def tower_images(self) -> list[int]:
        return [app.worker.batcher.stats.num_items for app in self.encoders]

    async def ask(self, image: bytes, request_id: str) -> None:
        parts = [
            route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=image)),
            route_service_pb2.ContentPart(text="what is this?"),
        ]
        request = route_service_pb2.GenerateRequest(
            request_id=request_id,
            model="tiny",
            messages=[route_service_pb2.ChatMessage(role="user", content=parts)],
            sampling=generation_pb2.SamplingParams(max_tokens=1),
        )
        async with create_channel(f"127.0.0.1:{self.route_port}") as channel:
            stub = route_service_pb2_grpc.RouteServiceStub(channel)
            [_ async for _ in stub.Generate(request)]

    async def holders(self, encoder_id: str) -> list[str]:
        listing = await self.scheduler.ListWorkers(scheduler_pb.ListWorkersRequest())
        (worker,) = [w for w in listing.workers if w.info.id == encoder_id]
        return list(worker.load.held_items.added_mm_hashes)


@pytest.fixture
async def stack(tiny_model_dir: Path) -> AsyncIterator[Stack]:
    scheduler, port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{port}"
    encoders = [
        await build_encode_server(
            EncodeConfig(
                tiny_model_dir,
                model_id="tiny",
                scheduler=endpoint,
                worker_id=f"enc{i}",
                heartbeat_interval_s=0.1,
            )
        )
        for i in range(2)
    ]
    prefill = await build_prefill_server(
        PrefillConfig(tiny_model_dir, scheduler=endpoint), CannedEngine()
    )
    route = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny"))
    try:
        async with create_channel(endpoint) as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            for _ in range(1200):  # NOTE: up to a minute on a loaded machine
                listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
                if len(listing.workers) == 3:
                    break
                await asyncio.sleep(0.05)
            assert len(listing.workers) == 3, listing
            yield Stack(route.port, stub, encoders)
    finally:
        await route.stop()
        await prefill.stop()
        for encoder in encoders:
            await encoder.stop()
        await scheduler.drain_and_stop(0)


async def test_one_new_image_asked_at_once_is_encoded_once(stack: Stack) -> None:
    image = png(picture(31, 64, 48))
    await asyncio.gather(*(stack.ask(image, f"sf-{i}") for i in range(NUM_REQUESTS)))
    assert sum(stack.tower_images()) == 1, stack.tower_images()
    encoded_by = stack.tower_images().index(1)
    holder = stack.encoders[encoded_by].info.id
    (mm_hash,) = stack.encoders[encoded_by].worker.cache.keys()
    assert await stack.holders(holder) == [mm_hash]
    await stack.ask(image, "sf-again")
    assert stack.tower_images()[encoded_by] == 1 and sum(stack.tower_images()) == 1
    other = stack.encoders[1 - encoded_by]
    assert len(other.worker.cache) == 0  # never sent there: nothing to look up
