"""``epd encode`` processes under load, for ``bench_encode.py``: the pictures sent, the processes
started, the clients that load them and what each process spent meanwhile (CPU by thread, the
tower's time per image in its batches)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from process_cpu import task_cpu
from prometheus_client.parser import text_string_to_metric_families

from epd.common.channels import create_channel, wait_for_health
from epd.launch.free_ports import free_port
from epd.server.media.hashing import mm_hash, processor_fingerprint
from epd.server.transfer.plane import DataPlane, default_host_id
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2, tensor_pb2

# the encoder's threads, as cpu_by_thread groups them
THREAD_ROLES = ("event_loop", "tower", "prepare", "other")


def images(count: int, seed: int) -> list[Image.Image]:
    """``count`` distinct random 336x448 pictures."""
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 255, (336, 448, 3), dtype=np.uint8)) for _ in range(count)
    ]


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass(frozen=True, slots=True)
class Picture:
    """One picture as the route holds it: PNG bytes, mm_hash and decoded pixels."""

    data: bytes
    mm_hash: str
    pixels: np.ndarray


def pictures_of(count: int, seed: int, model_dir: Path) -> list[Picture]:
    fingerprint = processor_fingerprint(model_dir)
    return [
        Picture(
            png(image),
            mm_hash(pixels, model_id=model_dir.name, processor_fingerprint=fingerprint),
            pixels,
        )
        for image in images(count, seed)
        for pixels in [np.array(image)]
    ]


@contextlib.contextmanager
def shared_pixels(
    given: str,
) -> Iterator[Callable[[Picture], contextlib.AbstractContextManager[Any]]]:
    """How a picture is sent: as PNG bytes, or (``pixels``) as the route sends it, its pixels put
    into the client's pooled shared memory tagged with its mm_hash just before the request and
    released after it (so segments are reused, as the route's are)."""
    plane = DataPlane(kinds=("shm",))

    @contextlib.contextmanager
    def item(picture: Picture) -> Iterator[multimodal_pb2.MediaItem]:
        if given != "pixels":
            yield multimodal_pb2.MediaItem(data=picture.data)
            return
        ref = plane.put(
            torch.from_numpy(picture.pixels),
            plane.host_id,
            preferred=tensor_pb2.TRANSFER_KIND_SHM,
            content_tag=bytes.fromhex(picture.mm_hash),
        )
        try:
            yield multimodal_pb2.MediaItem(mm_hash=picture.mm_hash, data=picture.data, pixels=ref)
        finally:
            plane.release([ref.lease_id])

    try:
        yield item
    finally:
        plane.close()


@dataclass(frozen=True, slots=True)
class Encoder:
    """One ``epd encode`` process: its gRPC endpoint, pid and Prometheus port."""

    endpoint: str
    pid: int
    metrics_port: int


@contextlib.contextmanager
def encoder_processes(
    model_dir: Path, on: tuple[str, str], max_batches: list[int], tower: dict[str, str]
) -> Iterator[list[Encoder]]:
    """One ``epd encode`` process per batch limit, on device and dtype ``on``, with the tower's
    execution ``tower`` (attention, patch_embedding), started together."""
    device, dtype = on
    ports = [(free_port(), free_port()) for _ in max_batches]
    servers = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "epd", "encode", "--model", str(model_dir)),
                *("--port", str(port), "--metrics-port", str(metrics_port)),
                *("--max-batch-size", str(max_batch)),
                *("--device", device, "--dtype", dtype, "--log-level", "WARNING"),
                *("--vision-attention", tower["attention"]),
                *("--patch-embedding", tower["patch_embedding"]),
            ],
            stdout=subprocess.DEVNULL,
        )
        for (port, metrics_port), max_batch in zip(ports, max_batches, strict=True)
    ]
    try:
        yield [
            Encoder(f"127.0.0.1:{port}", server.pid, metrics_port)
            for (port, metrics_port), server in zip(ports, servers, strict=True)
        ]
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
        for server in servers:
            server.wait(60)


def cpu_by_thread(pid: int) -> dict[str, float]:
    """CPU seconds so far of process ``pid`` by the encoder's thread roles, read from /proc: the
    event loop (the main thread), the tower's thread and the preparing pool (with the threads
    torch started from them, which inherit their names) and the rest (gRPC's)."""
    seconds = dict.fromkeys(THREAD_ROLES, 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, used = task_cpu(Path(f"/proc/{pid}/task/{tid}"))
        except OSError:
            continue
        role = "event_loop" if int(tid) == pid else name.removeprefix("epd-")
        seconds[role if role in seconds else "other"] += used
    return seconds


def batches_so_far(encoder: Encoder) -> tuple[float, float]:
    """(seconds the encoder's tower batches took, images in them) so far, from its metrics."""
    url = f"http://127.0.0.1:{encoder.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return (
        values.get("epd_encode_batch_duration_seconds_sum", 0.0),
        values.get("epd_encode_batch_size_sum", 0.0),
    )


def spent(encoders: list[Encoder]) -> tuple[dict[str, float], float, float]:
    """CPU seconds by thread role, batch seconds and batched images so far, over ``encoders``."""
    cpu = dict.fromkeys(THREAD_ROLES, 0.0)
    batch_seconds = batched = 0.0
    for encoder in encoders:
        for role, seconds in cpu_by_thread(encoder.pid).items():
            cpu[role] += seconds
        seconds, count = batches_so_far(encoder)
        batch_seconds += seconds
        batched += count
    return cpu, batch_seconds, batched


async def service(
    encoders: list[Encoder], pictures: list[Picture], given: str, clients: int
) -> dict[str, Any]:
    """Throughput of ``pictures[:-5]`` sent by ``clients`` concurrent clients spread over
    ``encoders``, and meanwhile the encoders' CPU per image by thread role and their towers'
    time per image in their batches (start to results); then cold and cache-hit latency of the
    last five on the first encoder."""
    host = default_host_id()
    for encoder in encoders:
        await wait_for_health(encoder.endpoint, timeout_s=300)
    async with contextlib.AsyncExitStack() as stack:
        channels = [
            await stack.enter_async_context(create_channel(encoder.endpoint))
            for encoder in encoders
        ]
        stubs = [pb_grpc.EncodeServiceStub(channel) for channel in channels]

        async def one(
            item: multimodal_pb2.MediaItem, stub: pb_grpc.EncodeServiceStub = stubs[0]
        ) -> tuple[float, pb.EncodeResponse]:
            start = time.perf_counter()
            request = pb.EncodeRequest(items=[item], consumer_host_id=host)
            responses = [r async for r in stub.Encode(request)]
            await stub.Release(pb.ReleaseRequest(lease_ids=[responses[0].embeddings.lease_id]))
            return time.perf_counter() - start, responses[0]

        for stub in stubs:
            await one(multimodal_pb2.MediaItem(data=png(images(1, 99)[0])), stub)
        with shared_pixels(given) as sent:
            queue, later = pictures[:-5], pictures[-5:]
            count = len(queue)

            async def client(stub: pb_grpc.EncodeServiceStub) -> None:
                while queue:
                    with sent(queue.pop()) as item:
                        await one(item, stub)

            cpu_before, batch_s_before, batched_before = spent(encoders)
            start = time.perf_counter()
            await asyncio.gather(*(client(stubs[i % len(stubs)]) for i in range(clients)))
            throughput = count / (time.perf_counter() - start)
            cpu_after, batch_s_after, batched_after = spent(encoders)
            cold = []
            for picture in later:
                with sent(picture) as item:
                    cold.append(await one(item))
        hits = [
            (await one(multimodal_pb2.MediaItem(mm_hash=r.mm_hash)))[0]
            for _, r in cold
            for _ in range(4)
        ]
    return {
        "ips": throughput,
        "cpu_ms": {
            role: (cpu_after[role] - cpu_before[role]) * 1000 / count for role in THREAD_ROLES
        },
        "tower_ms": (batch_s_after - batch_s_before)
        * 1000
        / max(batched_after - batched_before, 1),
        "cold_ms": statistics.median(t for t, _ in cold) * 1000,
        "hit_ms": statistics.median(hits) * 1000,
    }
