"""Encode-service benchmark against the same vision tower called directly, in one run.

With distinct random 336x448 pictures (``--preset tiny`` builds the tiny model, whose tower costs
little, as a GPU's does; ``small`` one whose CPU tower dominates; ``--model DIR`` any checkpoint):
- direct, batch 1 and batch 8: ``VisionEncoder.encode`` (processor + tower) on decoded images,
  one after another: the best the tower and its processor can do;
- the service (``epd encode`` in a process of its own, as deployed) over loopback gRPC,
  ``--clients`` concurrent clients (default 32: a batch in the
  tower, the next ones queued and prepared meanwhile), one image per request, batch 1 and
  dynamic batching (at most 8, no waiting), embeddings handed over through shared memory and
  released; each picture either as PNG bytes (``bytes``: the encoder decodes and hashes it) or as
  pixels the client shares tagged with their mm_hash just before the request and releases after
  it, as the route shares them (``pixels``); under dynamic batching, the service's CPU per image
  by thread (event loop, tower, preparing pool, the rest) beside the direct path's;
- per image, in this process one stage at a time: PNG decode, mm_hash, preprocessing (the
  processor, one image), tower (batch of 8, per image) and hand-off (put into shared memory and
  release);
- latency of one request, cold vs cache hit.
Ratios: service (dynamic) / direct batch 8 for each input, cache-hit / cold latency. With
``--device cuda`` the tower runs on the GPU (the service stages embeddings to a host-memory
consumer once) and the table adds the largest difference of its embeddings from the CPU's in
float32, relative to their largest value.

    .venv/bin/python scripts/bench_encode.py [--preset tiny|small | --model DIR] [--images N]
        [--device cuda] [--dtype auto|float32|bfloat16|float16]
        [--vision-attention auto|packed|sdpa|eager] [--patch-embedding auto|matmul|conv]
        [--clients N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from epd.common.channels import create_channel, wait_for_health
from epd.launch.launcher import free_port
from epd.server.encode.fast_tower import ATTENTIONS, PATCH_EMBEDDINGS
from epd.server.encode.vision import VisionEncoder
from epd.server.media.decode import decode_image
from epd.server.media.hashing import mm_hash, processor_fingerprint
from epd.server.media.policy import MediaPolicy
from epd.server.models.tiny.build import build_tiny_model, preset
from epd.server.transfer.plane import DataPlane, default_host_id
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2, tensor_pb2

BATCH = 8
INPUTS = ("bytes", "pixels")
# the encoder's threads, as cpu_by_thread groups them
THREAD_ROLES = ("event_loop", "tower", "prepare", "other")
# the tower's execution (fast_tower), the same for the direct path and the service
TOWER = {"attention": "auto", "patch_embedding": "auto"}


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


def per_image_ms(count: int, run: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    return (time.perf_counter() - start) * 1000 / count


def direct(encoder: VisionEncoder, count: int) -> dict[str, float]:
    encoder.encode(images(BATCH, 0))
    single, batched = images(count, 1), images(count, 2)
    b1 = per_image_ms(count, lambda: [encoder.encode([image]) for image in single], encoder.device)
    cpu_start = time.process_time()
    b8 = per_image_ms(
        count,
        lambda: [encoder.encode(batched[i : i + BATCH]) for i in range(0, count, BATCH)],
        encoder.device,
    )
    cpu_ms = (time.process_time() - cpu_start) * 1000 / count
    return {"direct_b1_ips": 1000 / b1, "direct_b8_ips": 1000 / b8, "direct_b8_cpu_ms": cpu_ms}


def stages(encoder: VisionEncoder, model_dir: Path, count: int) -> dict[str, float]:
    """Milliseconds per image of each stage the service adds up, one at a time."""
    pictures = images(count, 6)
    payloads = [png(image) for image in pictures]
    policy, fingerprint = MediaPolicy(), processor_fingerprint(model_dir)
    arrays = [np.array(decode_image(data, policy)) for data in payloads]
    tensors = [torch.from_numpy(array) for array in arrays]
    prepared = [encoder.prepare(pixels) for pixels in tensors]
    encoder.run(prepared[:BATCH])
    embeddings: list[torch.Tensor] = []
    plane = DataPlane(kinds=("shm",))
    device = encoder.device
    try:
        figures = {
            "decode_ms": per_image_ms(
                count, lambda: [decode_image(data, policy) for data in payloads], device
            ),
            "hash_ms": per_image_ms(
                count,
                lambda: [
                    mm_hash(a, model_id="m", processor_fingerprint=fingerprint) for a in arrays
                ],
                device,
            ),
            "preprocess_ms": per_image_ms(
                count, lambda: [encoder.prepare(pixels) for pixels in tensors], device
            ),
            "tower_ms": per_image_ms(
                count,
                lambda: embeddings.extend(
                    e
                    for i in range(0, count, BATCH)
                    for e, _ in encoder.run(prepared[i : i + BATCH])
                ),
                device,
            ),
        }

        def hand_over() -> None:
            for tensor in embeddings:
                plane.release([plane.put(tensor, plane.host_id).lease_id])

        figures["hand_off_ms"] = per_image_ms(count, hand_over, device)
    finally:
        plane.close()
    return figures


def difference_from_cpu(model_dir: Path, device: str, dtype: str) -> float:
    """Largest |device - CPU float32| over 4 images' embeddings, relative to the largest CPU
    value."""
    sample = images(4, 5)
    reference = [e for e, _ in VisionEncoder(model_dir, dtype="float32").encode(sample)]
    on_device = VisionEncoder(model_dir, device=device, dtype=dtype, **TOWER)
    measured = [e for e, _ in on_device.encode(sample)]
    return max(
        float((m.float().cpu() - r).abs().max() / r.abs().max())
        for m, r in zip(measured, reference, strict=True)
    )


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


@contextlib.contextmanager
def encoder_processes(
    model_dir: Path, on: tuple[str, str], max_batches: tuple[int, ...]
) -> Iterator[list[tuple[str, int]]]:
    """One ``epd encode`` process per batch limit, started together; their endpoints and pids."""
    device, dtype = on
    ports = [free_port() for _ in max_batches]
    servers = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "epd", "encode", "--model", str(model_dir)),
                *("--port", str(port), "--max-batch-size", str(max_batch)),
                *("--device", device, "--dtype", dtype, "--log-level", "WARNING"),
                *("--vision-attention", TOWER["attention"]),
                *("--patch-embedding", TOWER["patch_embedding"]),
            ],
            stdout=subprocess.DEVNULL,
        )
        for port, max_batch in zip(ports, max_batches, strict=True)
    ]
    try:
        yield [
            (f"127.0.0.1:{port}", server.pid) for port, server in zip(ports, servers, strict=True)
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
    tick = os.sysconf("SC_CLK_TCK")
    seconds = dict.fromkeys(THREAD_ROLES, 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        role = "event_loop" if int(tid) == pid else name.removeprefix("epd-")
        seconds[role if role in seconds else "other"] += (int(fields[11]) + int(fields[12])) / tick
    return seconds


async def service(
    endpoint: str, pid: int, pictures: list[Picture], given: str, clients: int
) -> dict[str, Any]:
    """Throughput of ``pictures[:-5]`` sent by ``clients`` concurrent clients, the server's CPU
    per image by thread role meanwhile, then cold and cache-hit latency of the last five."""
    host = default_host_id()
    await wait_for_health(endpoint, timeout_s=300)
    async with create_channel(endpoint) as channel:
        stub = pb_grpc.EncodeServiceStub(channel)

        async def one(item: multimodal_pb2.MediaItem) -> tuple[float, pb.EncodeResponse]:
            start = time.perf_counter()
            request = pb.EncodeRequest(items=[item], consumer_host_id=host)
            responses = [r async for r in stub.Encode(request)]
            await stub.Release(pb.ReleaseRequest(lease_ids=[responses[0].embeddings.lease_id]))
            return time.perf_counter() - start, responses[0]

        await one(multimodal_pb2.MediaItem(data=png(images(1, 99)[0])))
        with shared_pixels(given) as sent:
            queue, later = pictures[:-5], pictures[-5:]
            count = len(queue)

            async def client() -> None:
                while queue:
                    with sent(queue.pop()) as item:
                        await one(item)

            before = cpu_by_thread(pid)
            start = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            throughput = count / (time.perf_counter() - start)
            after = cpu_by_thread(pid)
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
        "cpu_ms": {role: (after[role] - before[role]) * 1000 / count for role in THREAD_ROLES},
        "cold_ms": statistics.median(t for t, _ in cold) * 1000,
        "hit_ms": statistics.median(hits) * 1000,
    }


def measure(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    on = (args.device, args.dtype)
    TOWER.update(attention=args.vision_attention, patch_embedding=args.patch_embedding)
    encoder = VisionEncoder(model_dir, device=args.device, dtype=args.dtype, **TOWER)
    figures: dict[str, Any] = {"model": model_dir.name, "device": str(encoder.device)}
    figures["clients"] = args.clients
    figures["attention"] = encoder.attention
    figures["fast_convolutions"] = encoder.num_fast_convolutions
    figures["dtype"] = str(encoder.dtype).removeprefix("torch.")
    figures.update(direct(encoder, args.images))
    figures.update(stages(encoder, model_dir, args.images))
    del encoder
    with encoder_processes(model_dir, on, (1, BATCH)) as (b1_at, dynamic_at):
        for index, given in enumerate(INPUTS):
            b1_pictures = pictures_of(args.images + 5, 10 + index, model_dir)
            dynamic_pictures = pictures_of(args.images + 5, 20 + index, model_dir)
            b1 = asyncio.run(service(*b1_at, b1_pictures, given, args.clients))
            dynamic = asyncio.run(service(*dynamic_at, dynamic_pictures, given, args.clients))
            figures[f"service_{given}_b1_ips"] = b1["ips"]
            figures[f"service_{given}_dynamic_ips"] = dynamic["ips"]
            figures[f"service_{given}_dynamic_cpu_ms"] = dynamic["cpu_ms"]
            figures[f"service_{given}_vs_direct_b8"] = dynamic["ips"] / figures["direct_b8_ips"]
            figures[f"service_{given}_b1_vs_direct_b1"] = b1["ips"] / figures["direct_b1_ips"]
            figures[f"{given}_cold_ms"] = dynamic["cold_ms"]
            figures[f"{given}_cache_hit_ms"] = dynamic["hit_ms"]
    figures["hit_vs_cold"] = figures["bytes_cache_hit_ms"] / figures["bytes_cold_ms"]
    if args.device != "cpu":
        figures["max_relative_difference_from_cpu"] = difference_from_cpu(model_dir, *on)
    return figures


def print_table(figures: dict[str, Any]) -> None:
    print(
        f"model {figures['model']} on {figures['device']} ({figures['dtype']}, "
        f"{figures['attention']} attention, {figures['fast_convolutions']} convolutions as "
        "matrix products)"
    )
    print(f"{'':34} {'images/s':>9}")
    rows = [("direct, batch 1", "direct_b1_ips"), ("direct, batch 8", "direct_b8_ips")]
    for given in INPUTS:
        rows += [
            (f"service, {given}, batch 1", f"service_{given}_b1_ips"),
            (f"service, {given}, dynamic (<=8)", f"service_{given}_dynamic_ips"),
        ]
    for label, key in rows:
        print(f"{label:34} {figures[key]:9.1f}")
    for given in INPUTS:
        print(
            f"service ({given}) dynamic / direct batch 8: "
            f"{figures[f'service_{given}_vs_direct_b8']:.2f}x; batch 1 / batch 1: "
            f"{figures[f'service_{given}_b1_vs_direct_b1']:.2f}x"
        )
    print(f"CPU ms per image: direct batch 8 {figures['direct_b8_cpu_ms']:.2f} (all threads)")
    for given in INPUTS:
        cpu = figures[f"service_{given}_dynamic_cpu_ms"]
        print(
            f"  service, {given}, dynamic {sum(cpu.values()):.2f}: "
            + ", ".join(f"{role.replace('_', ' ')} {ms:.2f}" for role, ms in cpu.items())
        )
    print(
        "per image, one stage at a time: "
        + ", ".join(
            f"{name} {figures[f'{name}_ms']:.2f} ms"
            for name in ("decode", "hash", "preprocess", "tower", "hand_off")
        )
    )
    print(
        f"latency cold {figures['bytes_cold_ms']:.1f} ms (pixels {figures['pixels_cold_ms']:.1f}),"
        f" cache hit {figures['bytes_cache_hit_ms']:.2f} ms: {figures['hit_vs_cold']:.3f}x"
    )
    if "max_relative_difference_from_cpu" in figures:
        print(
            f"{figures['device']} {figures['dtype']} vs CPU float32, largest relative difference: "
            f"{figures['max_relative_difference_from_cpu']:.2e}"
        )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, device, dtype and output flags this benchmark shares with
    bench_tower_compile.py."""
    parser.add_argument(
        "--preset", choices=["tiny", "small"], default="tiny", help="model to build (default tiny)"
    )
    parser.add_argument("--model", type=Path, help="a checkpoint directory instead of a preset")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto (bfloat16 on an accelerator, float32 on CPU), float32, bfloat16 or float16",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")


def report(
    args: argparse.Namespace,
    measure: Callable[[Path, argparse.Namespace], dict[str, Any]],
    print_table: Callable[[dict[str, Any]], None],
) -> int:
    """Measure on ``--model`` (or the ``--preset`` built for the run), then print the figures as a
    table or (``--json``) one JSON object."""
    with tempfile.TemporaryDirectory() as folder:
        model_dir = args.model or build_tiny_model(Path(folder) / args.preset, preset(args.preset))
        figures = measure(model_dir, args)
    if args.json:
        print(json.dumps(figures))
    else:
        print_table(figures)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--images", type=int, default=48, help="images per measurement")
    parser.add_argument(
        "--vision-attention",
        choices=ATTENTIONS,
        default="auto",
        help="the tower's attention, as epd encode's (default auto)",
    )
    parser.add_argument(
        "--patch-embedding",
        choices=PATCH_EMBEDDINGS,
        default="auto",
        help="the patch embedding, as epd encode's (default auto)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=32,
        help="concurrent clients of the service, one image per request (default 32)",
    )
    args = parser.parse_args()
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.images < BATCH or args.images % BATCH:
        parser.error(f"--images must be a multiple of {BATCH}")
    return report(args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
