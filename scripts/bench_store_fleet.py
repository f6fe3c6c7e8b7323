"""The embedding store in a fleet: tower runs and time to the first answer of a repeated-image
workload over two encoders, without and with the store, then after one encoder restarts.

One process, real gRPC: a scheduler, two encoders of ``--model`` (caches of ``--cache-mb``
each, so they evict), a prefill+decode worker on the transformers engine and a route; with the
store, a Mooncake master and its segment holder started as ``epd up`` starts them (the encoders
lend no memory). Phase ``repeated``: ``--images`` distinct images, each asked ``--repeats``
times in a shuffled order, ``--concurrency`` at a time, one answer token each. Then one encoder
is replaced by a fresh one of the same id (its cache empty). Phase ``restart``: every image asked
once more; phase ``minute``: the restarted fleet's first ``--window-s`` seconds (the ``restart``
round, then more rounds in shuffled orders until the window ends). Per phase: the tower's images
(both encoders), the store's hits, and the answers' time to first message (p50, p90).

    .venv/bin/python scripts/bench_store_fleet.py [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from epd.common.channels import create_channel
from epd.launch.launcher import Deployment
from epd.launch.store_service import MasterAddress, start_store
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeApp, EncodeConfig, build_encode_server
from epd.server.engine.transformers_engine import TransformersEngine
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.store.base import Lookup
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc

MODEL_ID = "tiny"


@dataclass
class Fleet:
    """The running services; ``towers_before`` counts what replaced encoders ran."""

    model: Path
    scheduler: str
    route_port: int
    encoders: list[EncodeApp]
    store: MasterAddress | None
    cache_mb: float
    store_timeout_ms: float
    towers_before: int = 0
    store_hits_before: int = 0
    restarts: list[EncodeApp] = field(default_factory=list)

    def towers(self) -> int:
        return self.towers_before + sum(
            int(e.worker.batcher.stats.num_items) for e in self.encoders
        )

    def store_hits(self) -> int:
        hits = sum(int(e.worker.store.counts.lookups[Lookup.HIT]) for e in self.encoders)
        return self.store_hits_before + hits

    def store_counts(self) -> dict[str, int]:
        """Lookups and publishes of the encoders serving now, by outcome."""
        counts: Counter[str] = Counter()
        for encoder in self.encoders:
            store = encoder.worker.store.counts
            counts.update({f"lookup_{k.value}": n for k, n in store.lookups.items()})
            counts.update({f"publish_{k.value}": n for k, n in store.publishes.items()})
        return dict(counts)


def picture(seed: int, size: int) -> bytes:
    generator = random.Random(seed)
    image = Image.new("RGB", (size, size))
    image.putdata([tuple(generator.randrange(256) for _ in range(3)) for _ in range(size * size)])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


async def start_encoder(fleet: Fleet, index: int) -> EncodeApp:
    store: dict[str, Any] = {}
    if fleet.store is not None:
        store = {
            "embedding_store": "mooncake",
            "store_master": fleet.store.master,
            "store_metadata_server": fleet.store.metadata_server,
            "store_timeout_ms": fleet.store_timeout_ms,
            "store_segment_mb": 0,
        }
    config = EncodeConfig(
        fleet.model,
        model_id=MODEL_ID,
        scheduler=fleet.scheduler,
        worker_id=f"enc{index}",
        cache_mb=fleet.cache_mb,
        heartbeat_interval_s=0.5,
        **store,
    )
    app = await build_encode_server(config)
    if fleet.store is not None:
        assert await app.worker.store.wait_connected(60), "the encoder did not join the store"
    return app


async def wait_registered(scheduler: str, count: int) -> None:
    async with create_channel(scheduler) as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        for _ in range(1200):
            listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
            live = [w for w in listing.workers if w.state == scheduler_pb.WORKER_STATE_LIVE]
            if len(live) == count:
                return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{count} workers did not register")


@asynccontextmanager
async def fleet_of(args: argparse.Namespace, store: MasterAddress | None) -> AsyncIterator[Fleet]:
    model = args.model
    scheduler, port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{port}"
    fleet = Fleet(model, endpoint, 0, [], store, args.cache_mb, args.store_timeout_ms)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(scheduler.drain_and_stop, 0)
        fleet.encoders = [await start_encoder(fleet, i) for i in range(2)]
        stack.push_async_callback(lambda: asyncio.gather(*(e.stop() for e in fleet.encoders)))
        engine = await TransformersEngine.start(model, model_id=MODEL_ID)
        prefill = await build_prefill_server(PrefillConfig(model, scheduler=endpoint), engine)
        stack.push_async_callback(prefill.stop)
        route = await build_route_server(RouteConfig(model, endpoint, MODEL_ID))
        stack.push_async_callback(route.stop)
        fleet.route_port = route.port
        await wait_registered(endpoint, 3)
        yield fleet


async def ask(fleet: Fleet, image: bytes) -> float:
    """Seconds to the route's first message for one question about ``image``."""
    parts = [
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=image)),
        route_service_pb2.ContentPart(text="What is in this picture?"),
    ]
    request = route_service_pb2.GenerateRequest(
        model=MODEL_ID,
        messages=[route_service_pb2.ChatMessage(role="user", content=parts)],
        sampling=generation_pb2.SamplingParams(max_tokens=1),
    )
    async with create_channel(f"127.0.0.1:{fleet.route_port}") as channel:
        start = time.perf_counter()
        first = None
        async for _ in route_service_pb2_grpc.RouteServiceStub(channel).Generate(request):
            first = first or time.perf_counter() - start
    assert first is not None
    return first


async def asked(
    fleet: Fleet, images: list[bytes], order: list[int], concurrency: int
) -> list[float]:
    """Seconds to the first message of each question, ``order`` naming the images."""
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> float:
        async with gate:
            return await ask(fleet, images[index])

    return list(await asyncio.gather(*(one(i) for i in order)))


def summary(seconds: list[float], tower_images: int, store_hits: int) -> dict[str, Any]:
    return {
        "requests": len(seconds),
        "tower_images": tower_images,
        "store_hits": store_hits,
        "ttft_p50_ms": statistics.median(seconds) * 1000,
        "ttft_p90_ms": statistics.quantiles(seconds, n=10)[-1] * 1000,
    }


async def phase(
    fleet: Fleet, images: list[bytes], order: list[int], concurrency: int
) -> dict[str, Any]:
    towers, hits = fleet.towers(), fleet.store_hits()
    seconds = await asked(fleet, images, order, concurrency)
    return summary(seconds, fleet.towers() - towers, fleet.store_hits() - hits)


async def first_minute(
    fleet: Fleet, images: list[bytes], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The ``restart`` round (every image once), and the ``minute``: that round and more
    rounds, each image once in a shuffled order, until ``args.window_s`` since the restart."""
    start, towers, hits = time.monotonic(), fleet.towers(), fleet.store_hits()
    seconds = await asked(fleet, images, list(range(len(images))), args.concurrency)
    restart = summary(seconds, fleet.towers() - towers, fleet.store_hits() - hits)
    shuffler = random.Random(1)
    while time.monotonic() - start < args.window_s:
        order = list(range(len(images)))
        shuffler.shuffle(order)
        seconds += await asked(fleet, images, order, args.concurrency)
    minute = summary(seconds, fleet.towers() - towers, fleet.store_hits() - hits)
    return [restart, {**minute, "seconds": time.monotonic() - start}]


async def restart_second_encoder(fleet: Fleet) -> None:
    old = fleet.encoders[1]
    fleet.towers_before += old.worker.batcher.stats.num_items
    fleet.store_hits_before += old.worker.store.counts.lookups[Lookup.HIT]
    await old.stop()
    fleet.encoders[1] = await start_encoder(fleet, 1)
    await wait_registered(fleet.scheduler, 3)


async def run_once(args: argparse.Namespace, store: MasterAddress | None) -> dict[str, Any]:
    images = [picture(seed, args.image_size) for seed in range(args.images)]
    order = [i for i in range(args.images) for _ in range(args.repeats)]
    random.Random(0).shuffle(order)
    async with fleet_of(args, store) as fleet:
        await ask(fleet, picture(10_000, args.image_size))  # NOTE: warm-up, not counted
        repeated = await phase(fleet, images, order, args.concurrency)
        counts = fleet.store_counts()
        await restart_second_encoder(fleet)
        restart, minute = await first_minute(fleet, images, args)
    # NOTE: counts since the encoders serving at the end of a phase started
    return {
        "store": store is not None,
        "repeated": {**repeated, "store_counts": counts},
        "restart": restart,
        "minute": {**minute, "store_counts": fleet.store_counts()},
    }


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [await run_once(args, None)]
    with tempfile.TemporaryDirectory() as run_dir:
        deployment = Deployment(Path(run_dir), dict(os.environ))
        store = start_store(deployment, args.store_segment_mb)
        try:
            await store.ready_args()
            rows.append(await run_once(args, store.master.address))
        finally:
            deployment.stop(grace_s=10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path(".epd/models/tiny"))
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument(
        "--cache-mb", type=float, default=0.125, help="each encoder's cache (0.125: 4 images)"
    )
    parser.add_argument(
        "--store-timeout-ms", type=float, default=50.0, help="the encoders' --store-timeout-ms"
    )
    parser.add_argument(
        "--store-segment-mb", type=int, default=256, help="the store holder's segment"
    )
    parser.add_argument(
        "--window-s", type=float, default=60.0, help="phase minute: seconds after the restart"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = asyncio.run(measure(args))
    if args.json:
        print(json.dumps({"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}))
        return
    print(
        f"{'store':<6} {'phase':<9} {'requests':>8} {'tower':>6} {'hits':>5} {'p50 ms':>8} "
        f"{'p90 ms':>8}"
    )
    for row in rows:
        for name in ("repeated", "restart", "minute"):
            p = row[name]
            print(
                f"{'yes' if row['store'] else 'no':<6} {name:<9} {p['requests']:>8} "
                f"{p['tower_images']:>6} {p['store_hits']:>5} {p['ttft_p50_ms']:>8.1f} "
                f"{p['ttft_p90_ms']:>8.1f}"
            )


if __name__ == "__main__":
    main()
