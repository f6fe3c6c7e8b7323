"""Autoscaling encoders on one host: a burst of image requests, then quiet, against ``epd up``
(E/PD, transformers engine, the tiny model or ``--model``, e.g. the small preset built by ``epd
model tiny --preset small --out .epd/models/small``, whose tower dominates on CPU) with a fixed
single encoder, a fixed maximum and ``--encoders 1:MAX`` (windows: up 2 s, down 8 s; the
scheduler's --encode-wait-target-s ``--wait-target-s``, --demand-smoothing-s 5).

For each deployment: ``--warmup`` requests one at a time (the scheduler learns the encoders'
cost: ``capacity`` is one encoder's images per second by it); then ``--burst-s`` seconds of
requests from ``--concurrency`` clients in a closed loop (each request one distinct ``--size``
picture, ``--tokens`` tokens), then ``--quiet-s`` seconds without any. Reported: the burst's
request rate, TTFT p50/p99, failed requests, the peak of the scheduler's offered encoder load and
count needed (``GetEncoderDemand``, every 0.25 s), encoder-seconds (encoders running, sampled
from the launcher's endpoints file every 0.25 s over burst and quiet), the most encoders running,
and when the count of encoders running changed (seconds after the burst's start; an added
encoder appears once it serves, a drained one once its drain begins). One table, or one JSON
object with ``--json``.

    .venv/bin/python scripts/bench_autoscale.py [--max-encoders 3] [--concurrency 24]
        [--burst-s 30] [--quiet-s 30] [--wait-target-s 0.003] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from epd.client.errors import EpdClientError
from epd.client.messages import user
from epd.client.sdk import AsyncEpdClient
from epd.common.channels import create_channel
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

MODEL = ".epd/models/tiny"
SAMPLE_S = 0.25


@dataclass
class Outcome:
    """What one deployment did under the burst."""

    name: str
    ttft_s: list[float] = field(default_factory=list)
    num_failed: int = 0
    encoder_seconds: float = 0.0
    max_encoders: int = 0
    capacity: float = 0.0  # one encoder's images per second, as measured before the burst
    burst_start: float = 0.0  # time.monotonic() at the burst's first request
    burst_s: float = 0.0  # from the first request of the burst to the last answer
    peak_load: float = 0.0  # the scheduler's offered encoder load, at most
    peak_needed: int = 0  # the scheduler's count of encoders needed, at most
    changes: list[tuple[float, int]] = field(default_factory=list)  # (s after burst, encoders)


def picture(seed: int, size: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def start(work: Path, encoders: str, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """``epd up --keep`` with short scaling windows; returns once its endpoints are written."""
    flags = ["--topology", "e-pd", "--engine", "transformers", "--encoders", encoders]
    flags += ["--scale-up-after-s", "2", "--scale-down-after-s", "8", "--scale-interval-s", "0.25"]
    flags += ["--encode-wait-target-s", str(args.wait_target_s), "--demand-smoothing-s", "5"]
    command = [sys.executable, "-m", "epd", "up", "--keep", "--no-demo", "--model", args.model]
    command += ["--endpoints-file", str(work / "endpoints.json"), "--run-dir", str(work / "run")]
    log = open(work / "launcher.log", "wb")  # noqa: SIM115 - the child holds it
    launcher = subprocess.Popen([*command, *flags], stdout=log, stderr=subprocess.STDOUT)
    while not (work / "endpoints.json").exists():
        if launcher.poll() is not None:
            raise RuntimeError((work / "launcher.log").read_text())
        time.sleep(0.5)
    return launcher


def encoders_running(work: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        endpoints = json.loads((work / "endpoints.json").read_text())
        return sum(1 for name in endpoints if name.startswith("encode"))
    return 0


async def ask(client: AsyncEpdClient, seed: int, args: argparse.Namespace) -> float:
    """Seconds to the first token of a question about picture ``seed``."""
    start, first = time.monotonic(), None
    message = user("What is in this picture?", image=picture(seed, args.size))
    async for _ in client.stream([message], max_tokens=args.tokens, ignore_eos=True):
        first = first or time.monotonic() - start
    if first is None:
        raise RuntimeError("no token")
    return first


async def capacity(route: str, scheduler: str, args: argparse.Namespace) -> float:
    """One encoder's images per second: the inverse of its learned cost after the warm-up."""
    async with AsyncEpdClient(route, timeout_s=120) as client:
        for seed in range(args.warmup):
            await ask(client, 10_000 + seed, args)
    reply = await demand(scheduler)
    return 1 / max(d.image_cost_seconds for d in reply.demands)


async def demand(scheduler: str) -> pb.GetEncoderDemandResponse:
    async with create_channel(scheduler) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        reply: pb.GetEncoderDemandResponse = await stub.GetEncoderDemand(
            pb.GetEncoderDemandRequest()
        )
        return reply


async def burst(route: str, args: argparse.Namespace, outcome: Outcome) -> None:
    """``args.burst_s`` seconds of requests from ``args.concurrency`` clients in a loop."""
    deadline = outcome.burst_start + args.burst_s

    async def lane(client: AsyncEpdClient, index: int) -> None:
        seed = 100_000 * (index + 1)
        while time.monotonic() < deadline:
            seed += 1
            try:
                outcome.ttft_s.append(await ask(client, seed, args))
            except (EpdClientError, RuntimeError):
                outcome.num_failed += 1

    async with AsyncEpdClient(route, timeout_s=300) as client:
        await asyncio.gather(*(lane(client, index) for index in range(args.concurrency)))
    outcome.burst_s = time.monotonic() - outcome.burst_start


async def sample(work: Path, outcome: Outcome, until: asyncio.Event) -> None:
    """Encoders running every SAMPLE_S: encoder-seconds, the most, each change's time; the
    scheduler's offered load and count needed, their peaks."""
    last = -1
    scheduler = json.loads((work / "endpoints.json").read_text())["scheduler"]
    while not until.is_set():
        with contextlib.suppress(Exception):
            for found in (await demand(scheduler)).demands:
                outcome.peak_load = max(outcome.peak_load, found.load_encoders)
                outcome.peak_needed = max(outcome.peak_needed, found.num_needed)
        running = encoders_running(work)
        outcome.encoder_seconds += running * SAMPLE_S
        outcome.max_encoders = max(outcome.max_encoders, running)
        if running != last:
            outcome.changes.append((time.monotonic() - outcome.burst_start, running))
            last = running
        await asyncio.sleep(SAMPLE_S)


async def measure(work: Path, name: str, args: argparse.Namespace) -> Outcome:
    endpoints = json.loads((work / "endpoints.json").read_text())
    outcome = Outcome(name)
    outcome.capacity = await capacity(endpoints["route"], endpoints["scheduler"], args)
    outcome.burst_start = time.monotonic()
    done = asyncio.Event()
    sampler = asyncio.ensure_future(sample(work, outcome, done))
    await burst(endpoints["route"], args, outcome)
    await asyncio.sleep(args.quiet_s)
    done.set()
    await sampler
    return outcome


def run(name: str, encoders: str, args: argparse.Namespace) -> Outcome:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        launcher = start(work, encoders, args)
        try:
            return asyncio.run(measure(work, name, args))
        finally:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(120)


def percentile(values: list[float], share: float) -> float:
    return float(np.percentile(values, share * 100)) if values else float("nan")


def row(outcome: Outcome) -> dict[str, Any]:
    return {
        "deployment": outcome.name,
        "capacity_images_per_s": round(outcome.capacity, 1),
        "requests": len(outcome.ttft_s) + outcome.num_failed,
        "requests_per_s": round(len(outcome.ttft_s) / outcome.burst_s, 1),
        "failed": outcome.num_failed,
        "ttft_p50_s": round(percentile(outcome.ttft_s, 0.5), 3),
        "ttft_p99_s": round(percentile(outcome.ttft_s, 0.99), 3),
        "peak_load_encoders": round(outcome.peak_load, 2),
        "peak_needed": outcome.peak_needed,
        "encoder_seconds": round(outcome.encoder_seconds, 1),
        "max_encoders": outcome.max_encoders,
        "encoders_at_s": [(round(t, 1), n) for t, n in outcome.changes],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help="e.g. .epd/models/small (see --help)")
    parser.add_argument("--max-encoders", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--burst-s", type=float, default=30.0)
    parser.add_argument("--quiet-s", type=float, default=30.0)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--size", type=int, default=448, help="pictures' side in pixels")
    parser.add_argument("--tokens", type=int, default=2)
    parser.add_argument("--wait-target-s", type=float, default=0.003)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    top = args.max_encoders
    plans = [("fixed 1", "1"), (f"fixed {top}", str(top)), (f"autoscaled 1:{top}", f"1:{top}")]
    rows = [row(run(name, encoders, args)) for name, encoders in plans]
    if args.json:
        print(json.dumps({"settings": vars(args), "deployments": rows}))
        return 0
    keys = [k for k in rows[0] if k != "encoders_at_s"]
    print(" | ".join(keys))
    for found in rows:
        print(" | ".join(str(found[k]) for k in keys))
    for found in rows:
        print(
            f"{found['deployment']}: encoders (s after the burst's start, count) "
            f"{found['encoders_at_s']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
