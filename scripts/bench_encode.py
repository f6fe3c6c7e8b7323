"""Encode-service benchmark against the same vision tower called directly, in one run.

On the "small" preset (encoding costs real time), with distinct random images:
- direct, batch 1: VisionEncoder.encode([image]) one after another;
- direct, batch 8: VisionEncoder.encode(8 images) (the best the tower can do);
- service, batch 1 and dynamic batching (max 8): 8 concurrent clients over loopback gRPC, one
  image per request, embeddings handed over through shared memory and released;
- latency of one request, cold vs cache hit.
Ratios: service throughput / direct throughput (target >= 0.9 at saturation), cache-hit latency /
cold latency (target <= 0.1). With ``--device cuda`` the tower runs on the GPU (the service hands
embeddings to a host-memory consumer: staged once into shared memory) and the table adds the
largest difference of its embeddings from the CPU's in float32, relative to their largest value.

    .venv/bin/python scripts/bench_encode.py [--images N] [--device cuda] [--dtype D] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from epd.common.channels import create_channel
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.encode.vision import VisionEncoder
from epd.server.engine.tiny_model import build_tiny_model, preset
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2

CONCURRENCY = 8


def images(count: int, seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 255, (336, 448, 3), dtype=np.uint8)) for _ in range(count)
    ]


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (the tower's output stays on its device)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def direct(model_dir: Path, count: int, device: str, dtype: str) -> dict[str, float]:
    encoder = VisionEncoder(model_dir, device=device, dtype=dtype)
    encoder.encode(images(1, 0))
    batch1 = images(count, 1)
    synchronize(encoder.device)
    start = time.perf_counter()
    for image in batch1:
        encoder.encode([image])
    synchronize(encoder.device)
    single = count / (time.perf_counter() - start)
    batched_images = images(count, 2)
    start = time.perf_counter()
    for i in range(0, count, CONCURRENCY):
        encoder.encode(batched_images[i : i + CONCURRENCY])
    synchronize(encoder.device)
    return {"direct_b1_ips": single, "direct_b8_ips": count / (time.perf_counter() - start)}


def difference_from_cpu(model_dir: Path, device: str, dtype: str) -> float:
    """Largest |device - CPU float32| over 4 images' embeddings, relative to the largest CPU
    value."""
    sample = images(4, 5)
    reference = [e for e, _ in VisionEncoder(model_dir).encode(sample)]
    measured = [e for e, _ in VisionEncoder(model_dir, device=device, dtype=dtype).encode(sample)]
    return max(
        float((m.float().cpu() - r).abs().max() / r.abs().max())
        for m, r in zip(measured, reference, strict=True)
    )


async def service(
    model_dir: Path, count: int, max_batch: int, seed: int, device: str, dtype: str
) -> dict[str, float]:
    app = await build_encode_server(
        EncodeConfig(
            model_dir, max_batch_size=max_batch, max_batch_wait_ms=10, device=device, dtype=dtype
        )
    )
    payloads = [png(image) for image in images(count, seed)]
    host = app.plane.host_id
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        stub = pb_grpc.EncodeServiceStub(channel)

        async def one(data: bytes, mm_hash: str = "") -> tuple[float, pb.EncodeResponse]:
            start = time.perf_counter()
            request = pb.EncodeRequest(
                items=[multimodal_pb2.MediaItem(data=data, mm_hash=mm_hash)], consumer_host_id=host
            )
            responses = [r async for r in stub.Encode(request)]
            await stub.Release(pb.ReleaseRequest(lease_ids=[responses[0].embeddings.lease_id]))
            return time.perf_counter() - start, responses[0]

        await one(png(images(1, 99)[0]))
        queue = list(payloads)

        async def client() -> None:
            while queue:
                await one(queue.pop())

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        throughput = count / (time.perf_counter() - start)
        cold = [await one(data) for data in (png(image) for image in images(5, seed + 7))]
        hits = [(await one(b"", r.mm_hash))[0] for _, r in cold for _ in range(4)]
    await app.stop()
    return {
        "ips": throughput,
        "cold_ms": statistics.median(t for t, _ in cold) * 1000,
        "hit_ms": statistics.median(hits) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=48, help="images per measurement")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    parser.add_argument(
        "--dtype", default="float32", help="float32, bfloat16 or float16 (default float32)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    on = (args.device, args.dtype)
    with tempfile.TemporaryDirectory() as folder:
        model_dir = build_tiny_model(Path(folder) / "small", preset("small"))
        figures = direct(model_dir, args.images, *on)
        b1 = asyncio.run(service(model_dir, args.images, 1, 3, *on))
        dyn = asyncio.run(service(model_dir, args.images, CONCURRENCY, 4, *on))
        if args.device != "cpu":
            figures["max_relative_difference_from_cpu"] = difference_from_cpu(model_dir, *on)
    figures.update(
        {
            "service_b1_ips": b1["ips"],
            "service_dynamic_ips": dyn["ips"],
            "cold_ms": dyn["cold_ms"],
            "cache_hit_ms": dyn["hit_ms"],
        }
    )
    figures["service_vs_direct_b8"] = figures["service_dynamic_ips"] / figures["direct_b8_ips"]
    figures["service_b1_vs_direct_b1"] = figures["service_b1_ips"] / figures["direct_b1_ips"]
    figures["hit_vs_cold"] = figures["cache_hit_ms"] / figures["cold_ms"]
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{'':26} {'images/s':>9}")
    for label, key in (
        ("direct, batch 1", "direct_b1_ips"),
        ("direct, batch 8", "direct_b8_ips"),
        ("service, batch 1", "service_b1_ips"),
        ("service, dynamic (<=8)", "service_dynamic_ips"),
    ):
        print(f"{label:26} {figures[key]:9.1f}")
    print(
        f"service dynamic / direct batch 8: {figures['service_vs_direct_b8']:.2f}x (target >= 0.9)"
    )
    print(f"service batch 1 / direct batch 1: {figures['service_b1_vs_direct_b1']:.2f}x")
    print(
        f"latency cold {figures['cold_ms']:.1f} ms, cache hit {figures['cache_hit_ms']:.2f} ms: "
        f"{figures['hit_vs_cold']:.3f}x (target <= 0.1)"
    )
    if "max_relative_difference_from_cpu" in figures:
        print(
            f"{args.device} {args.dtype} vs CPU float32, largest relative difference: "
            f"{figures['max_relative_difference_from_cpu']:.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
