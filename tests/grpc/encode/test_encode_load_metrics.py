"""An encoder's load for autoscaling: its queue in images and vision tokens, its busy fraction
and its cost per image and per token, as Prometheus reads them."""

from __future__ import annotations

import asyncio
import threading

from epd.common.channels import create_channel
from epd.common.server import ServerOptions
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.metrics import BusyMeter
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.encode.test_encode_service import png, request
from tests.scrape import scrape, value


async def test_the_queue_counts_images_and_their_tokens() -> None:
    started, release = threading.Event(), threading.Event()

    def run(items: list[int]) -> list[int]:
        started.set()
        release.wait(10)
        return items

    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, max_items=2)
    batcher.weigh = lambda tokens: tokens
    tasks = [asyncio.ensure_future(batcher.submit(tokens)) for tokens in (10, 20, 30, 40, 50)]
    await asyncio.to_thread(started.wait, 10)
    assert (batcher.running_weight, batcher.queue_depth, batcher.queued_weight) == (30, 3, 120)
    release.set()
    assert await asyncio.gather(*tasks) == [10, 20, 30, 40, 50]
    assert (batcher.running_weight, batcher.queue_depth, batcher.queued_weight) == (0, 0, 0)
    assert batcher.stats.batch_weight == 50  # NOTE: batches of 10+20, 30+40, then 50
    await batcher.close()


def test_busy_is_the_share_of_the_window_spent_in_batches() -> None:
    now = [0.0]
    meter = BusyMeter(window_s=10.0, clock=lambda: now[0])
    for _ in range(4):
        now[0] += 1.0
        meter.add(0.5)
    assert meter.ratio() == 0.2 and meter.total_s == 2.0
    now[0] += 9.5
    assert meter.ratio() == 0.05  # the last batch alone is within the window
    now[0] += 1.0
    assert meter.ratio() == 0.0 and meter.total_s == 2.0


async def test_an_encoder_exports_its_load(tiny_model_dir) -> None:
    config = EncodeConfig(tiny_model_dir, model_id="tiny")
    app = await build_encode_server(config, ServerOptions(metrics_port=0))
    url = f"http://127.0.0.1:{app.server.metrics.port}/metrics"
    try:
        idle = await asyncio.to_thread(scrape, url)
        async with create_channel(f"127.0.0.1:{app.port}") as channel:
            stub = pb_grpc.EncodeServiceStub(channel)
            items = [multimodal_pb2.MediaItem(data=png(40 + i)) for i in range(3)]
            responses = [r async for r in stub.Encode(request(*items))]
            await stub.Release(
                pb.ReleaseRequest(lease_ids=[r.embeddings.lease_id for r in responses])
            )
        busy = await asyncio.to_thread(scrape, url)
    finally:
        await app.stop()
    assert value(idle, "epd_encode_busy_ratio") == 0
    assert value(idle, "epd_encode_queue_image_tokens") == 0
    assert not [s for s in idle if s.name == "epd_encode_image_cost_seconds"]
    tower_s = value(busy, "epd_encode_tower_seconds_total")
    assert 0 < tower_s == value(busy, "epd_encode_batch_duration_seconds_sum")
    assert value(busy, "epd_encode_busy_ratio") == min(1.0, tower_s / 10)
    assert value(busy, "epd_encode_queue_image_tokens") == 0
    image_cost = value(busy, "epd_encode_image_cost_seconds")
    token_cost = value(busy, "epd_encode_image_token_cost_seconds")
    tokens_per_image = responses[0].embeddings.shape[0]
    assert all(r.embeddings.shape[0] == tokens_per_image for r in responses)
    assert 0 < image_cost <= tower_s
    assert abs(token_cost * tokens_per_image - image_cost) < 1e-9
