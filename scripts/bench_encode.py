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
  by thread (event loop, tower, preparing pool, the rest) beside the direct path's, and the
  tower's time per image in the service's batches against the tower called alone ("tower x":
  above 1 where the tower waits, e.g. for the interpreter lock the process's other threads hold);
  with ``--encoders 1,2`` the same load again on two encoder processes on the same device;
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
        [--clients N] [--encoders 1[,N...]] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from encode_load import encoder_processes, images, pictures_of, png, service

from epd.server.encode.fast_tower import ATTENTIONS, PATCH_EMBEDDINGS
from epd.server.encode.vision import VisionEncoder
from epd.server.media.decode import decode_image
from epd.server.media.hashing import mm_hash, processor_fingerprint
from epd.server.media.policy import MediaPolicy
from epd.server.models.tiny.build import build_tiny_model, preset
from epd.server.transfer.plane import DataPlane

BATCH = 8
INPUTS = ("bytes", "pixels")
# the tower's execution (fast_tower), the same for the direct path and the service
TOWER = {"attention": "auto", "patch_embedding": "auto"}


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


def encoders_suffix(count: int) -> str:
    """What the figures of ``count`` encoder processes add to their keys ("" for one)."""
    return f"_x{count}" if count > 1 else ""


def measure(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    on = (args.device, args.dtype)
    TOWER.update(attention=args.vision_attention, patch_embedding=args.patch_embedding)
    encoder = VisionEncoder(model_dir, device=args.device, dtype=args.dtype, **TOWER)
    figures: dict[str, Any] = {"model": model_dir.name, "device": str(encoder.device)}
    figures["clients"] = args.clients
    figures["encoders"] = args.encoders
    figures["attention"] = encoder.attention
    figures["fast_convolutions"] = encoder.num_fast_convolutions
    figures["dtype"] = str(encoder.dtype).removeprefix("torch.")
    figures.update(direct(encoder, args.images))
    figures.update(stages(encoder, model_dir, args.images))
    del encoder
    limits = [1] + [BATCH for count in args.encoders for _ in range(count)]
    with encoder_processes(model_dir, on, limits, TOWER) as started:
        b1_at, rest = started[:1], started[1:]
        groups = {}
        for count in args.encoders:
            groups[count], rest = rest[:count], rest[count:]
        for index, given in enumerate(INPUTS):
            b1_pictures = pictures_of(args.images + 5, 10 + index, model_dir)
            b1 = asyncio.run(service(b1_at, b1_pictures, given, args.clients))
            figures[f"service_{given}_b1_ips"] = b1["ips"]
            figures[f"service_{given}_b1_vs_direct_b1"] = b1["ips"] / figures["direct_b1_ips"]
            for count, at in groups.items():
                pictures = pictures_of(args.images * count + 5, 20 + index, model_dir)
                dynamic = asyncio.run(service(at, pictures, given, args.clients))
                suffix = encoders_suffix(count)
                key = f"service_{given}_dynamic{suffix}"
                figures[f"{key}_ips"] = dynamic["ips"]
                figures[f"{key}_cpu_ms"] = dynamic["cpu_ms"]
                figures[f"{key}_tower_ms"] = dynamic["tower_ms"]
                figures[f"{key}_tower_slowdown"] = dynamic["tower_ms"] / figures["tower_ms"]
                figures[f"service_{given}{suffix}_vs_direct_b8"] = (
                    dynamic["ips"] / figures["direct_b8_ips"]
                )
                if count == 1:
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
    counts = figures["encoders"]
    print(f"{'':42} {'images/s':>9} {'/ direct b8':>11} {'tower x':>8}")
    print(f"{'direct, batch 1':42} {figures['direct_b1_ips']:9.1f}")
    print(f"{'direct, batch 8':42} {figures['direct_b8_ips']:9.1f} {1:11.2f} {1:8.2f}")
    for given in INPUTS:
        ips = figures[f"service_{given}_b1_ips"]
        print(f"{f'service, {given}, batch 1':42} {ips:9.1f}")
        for count in counts:
            suffix = encoders_suffix(count)
            key = f"service_{given}_dynamic{suffix}"
            label = f"service, {given}, dynamic (<=8)" + (f", {count} encoders" if suffix else "")
            print(
                f"{label:42} {figures[f'{key}_ips']:9.1f} "
                f"{figures[f'service_{given}{suffix}_vs_direct_b8']:11.2f} "
                f"{figures[f'{key}_tower_slowdown']:8.2f}"
            )
    print(
        "tower x: the tower's time per image in the service's batches against the same tower "
        "called alone (batch 8)"
    )
    for given in INPUTS:
        print(
            f"service ({given}) batch 1 / direct batch 1: "
            f"{figures[f'service_{given}_b1_vs_direct_b1']:.2f}x"
        )
    print(f"CPU ms per image: direct batch 8 {figures['direct_b8_cpu_ms']:.2f} (all threads)")
    for given in INPUTS:
        for count in counts:
            suffix = encoders_suffix(count)
            cpu = figures[f"service_{given}_dynamic{suffix}_cpu_ms"]
            print(
                f"  service, {given}, dynamic{f', {count} encoders' if suffix else ''} "
                f"{sum(cpu.values()):.2f}: "
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


def encoder_counts(text: str) -> list[int]:
    """``--encoders``: distinct positive counts, 1 among them, in the order given."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if 1 not in counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError("distinct numbers of at least 1, 1 among them (e.g. 1,2)")
    return counts


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
    parser.add_argument(
        "--encoders",
        type=encoder_counts,
        default=[1],
        help="comma-separated numbers of encoder processes on the device that share the load "
        "under dynamic batching, each measured in turn (default 1; it must include 1, e.g. 1,2)",
    )
    args = parser.parse_args()
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.images < BATCH or args.images % BATCH:
        parser.error(f"--images must be a multiple of {BATCH}")
    return report(args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
