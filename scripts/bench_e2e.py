"""End-to-end serving benchmark: TTFT p50/p99, TPOT and throughput of whole deployments (each
started by the ``epd up`` launcher as real processes) against monolithic vLLM serving the same
model on this machine in the same run, all driven through the OpenAI chat API with streaming.

Systems (``--systems``, comma separated): ``epd`` (E/P/D), ``e-pd`` (E/PD), ``ep-d``, ``epd1``,
``dual-encoder:POLICY`` (two encoders, POLICY per_image|per_request|adaptive; with
``--encoder-threads 2,1`` the second one is deliberately slower), any epd system with its
encoders' devices after ``@`` (``e-pd@cuda`` GPU only, ``e-pd@cpu`` CPU only,
``e-pd:per_request@cuda/cpu`` one of each under per_request, ``--split-ratio`` applying), ``vllm``
(``python -m vllm.entrypoints.openai.api_server``, vision tower in the engine) and ``vllm-ec``
(vLLM's own disaggregated-encoder split: an encode instance and a prefill+decode instance with
vLLM's ECExampleConnector, behind ``scripts/vllm_ec_proxy.py``, as in vLLM's example). An epd system
named with ``+metrics`` (e.g. ``e-pd+metrics``) runs with every service's Prometheus metrics on,
each scraped every second while it serves; without it, metrics are off. Every request
carries ``--images`` random pictures of its own (no cache hits) as data URLs, at each
``--concurrency`` level and each ``--rates`` request rate (Poisson arrivals; 0 = as fast as the
concurrency lets). Where vllm (or vllm-ec) ran at the same level, each row also shows its TTFT
p50 and throughput as ratios to vllm's (and to vllm-ec's). Pictures are made before a level
starts, so the client's own CPU goes to streaming only. After the table, each level's CPU time
per request is broken down by process (from /proc: each service with its engine processes, and
this client), which shows where a saturated machine's cores go.

With ``--video`` every request carries a synthetic clip instead (``e2e_video.py``): epd with
one, two and three encoders sharing each clip in chunks, against monolithic vLLM given the same
decoded frames, and a repeated clip's TTFT against its first.

    .venv/bin/python scripts/bench_e2e.py [--model DIR] [--systems epd,e-pd,vllm]
        [--concurrency 1,4] [--rates 0] [--requests 16] [--tokens 16] [--images 1]
        [--encoder-threads 2,1] [--split-ratio 2:1] [--csv out.csv] [--json]
    .venv/bin/python scripts/bench_e2e.py --video [--clip-sizes 320x240,640x480]
        [--clip-seconds 6] [--clip-fps 10] [--repeats 4] [--concurrency 1,4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import functools
import io
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from e2e_report import (
    FIELDS,
    Row,
    compare_to_vllm,
    print_cpu_table,
    print_ideal_table,
    print_table,
    share_of_ideal,
)
from e2e_serving import log, serving
from PIL import Image
from process_cpu import cpu_by_process

from epd.launch.cpu_layout import LAYOUTS

DEFAULT_VIDEO_SYSTEMS = "e-pd@auto,e-pd:per_image@auto/auto,e-pd:per_image@auto/auto/auto,vllm"


def tiny_model_dir() -> Path:
    """The tiny model ``epd up`` uses by default, built there if absent."""
    model_dir = Path(".epd/models/tiny")
    if not (model_dir / "config.json").exists():
        from epd.server.models.tiny.build import build_tiny_model

        build_tiny_model(model_dir)
    return model_dir


def data_url(seed: int) -> str:
    """A random 224x224 PNG as a data URL (a distinct picture per seed)."""
    pixels = np.random.default_rng(seed).integers(0, 255, (224, 224, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def pictures_of(seed: int, images: int) -> list[dict[str, Any]]:
    """The chat content of request ``seed``: ``images`` pictures and the question."""
    pictures = [
        {"type": "image_url", "image_url": {"url": data_url(seed * 16 + i)}} for i in range(images)
    ]
    return [*pictures, {"type": "text", "text": "What is in this picture?"}]


async def one_request(
    client: object, model: str, content: list[dict[str, Any]], tokens: int
) -> tuple[float, float, int]:
    """(TTFT s, total s, output tokens) of one streamed chat completion of ``content``."""
    start = time.perf_counter()
    stream = await client.chat.completions.create(  # type: ignore[attr-defined]
        model=model,
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": content}],
    )
    first, completion = None, 0
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
    total = time.perf_counter() - start
    return (first if first is not None else total), total, completion


async def measure(
    base_url: str,
    model: str,
    system: str,
    concurrency: int,
    rate: float,
    num_requests: int,
    tokens: int,
    content_of: Callable[[int], list[dict[str, Any]]],
    first_seed: int,
    processes: dict[str, int],
) -> Row:
    """One level: ``num_requests`` requests (seeds from ``first_seed``, the content of each from
    ``content_of``, made before the level starts) after one warm-up."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="-", timeout=600)
    await one_request(client, model, content_of(first_seed + 10_000), tokens=2)
    pictures = {seed: content_of(first_seed + seed) for seed in range(num_requests)}
    semaphore = asyncio.Semaphore(concurrency)
    results: list[tuple[float, float, int]] = []
    failed = 0

    async def run(seed: int) -> None:
        nonlocal failed
        async with semaphore:
            try:
                results.append(await one_request(client, model, pictures[seed], tokens))
            except Exception as e:  # noqa: BLE001 - counted and reported
                failed += 1
                print(f"  request failed: {e}", file=sys.stderr)

    cpu_before = cpu_by_process(processes)
    start = time.perf_counter()
    tasks = []
    async for seed in arrivals(num_requests, rate):
        tasks.append(asyncio.create_task(run(seed)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    cpu_used = {
        name: seconds - cpu_before.get(name, 0.0)
        for name, seconds in cpu_by_process(processes).items()
    }
    await client.close()
    ttfts = sorted(r[0] * 1000 for r in results) or [float("nan")]
    tpots = [(r[1] - r[0]) * 1000 / (r[2] - 1) for r in results if r[2] > 1] or [float("nan")]
    return Row(
        system,
        concurrency,
        rate,
        len(results),
        failed,
        statistics.median(ttfts),
        ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        statistics.mean(tpots),
        sum(r[2] for r in results) / elapsed,
        len(results) / elapsed,
        cpu_ms_per_request={
            name: round(1000 * seconds / max(1, len(results)), 2)
            for name, seconds in sorted(cpu_used.items(), key=lambda item: -item[1])
        },
    )


async def arrivals(num_requests: int, rate: float) -> AsyncIterator[int]:
    """Request seeds, spaced by exponential gaps at ``rate``/s (0: all at once)."""
    for seed in range(num_requests):
        if rate > 0 and seed:
            await asyncio.sleep(random.expovariate(rate))
        yield seed


async def main(args: argparse.Namespace) -> int:
    model_dir = args.model or tiny_model_dir()
    run_root = Path(tempfile.mkdtemp(prefix="epd-bench-"))
    if args.video:
        from e2e_video import run_video

        return await run_video(args, model_dir, run_root)
    rates = parse_list(args.rates, float)
    levels = [(c, r) for c in parse_list(args.concurrency, int) for r in rates]
    rows: list[Row] = []
    for index, system in enumerate(args.systems.split(",")):
        log(args, f"== {system}: starting")
        async with serving(
            system, model_dir.resolve(), run_root / system.replace(":", "-"), args
        ) as (url, processes):
            for level, (concurrency, rate) in enumerate(levels):
                first_seed = (index * len(levels) + level) * args.requests
                row = await measure(
                    url,
                    "tiny",
                    system,
                    concurrency,
                    rate,
                    args.requests,
                    args.tokens,
                    functools.partial(pictures_of, images=args.images),
                    first_seed,
                    processes,
                )
                rows.append(row)
                if not args.json:
                    print_table([row])
    compare_to_vllm(rows)
    share_of_ideal(rows)
    if args.json:
        print(
            json.dumps(
                {
                    "model": str(model_dir),
                    "images": args.images,
                    "tokens": args.tokens,
                    "rows": [asdict(r) for r in rows],
                }
            )
        )
    else:
        print()
        print_table(rows)
        print()
        print_ideal_table(rows)
        print_cpu_table(rows)
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
        log(args, f"wrote {args.csv}; logs in {run_root}")
    return 0 if all(r.failed == 0 for r in rows) else 1


def parse_list(text: str, kind: type[float] | type[int]) -> list[Any]:
    return [kind(part) for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument(
        "--systems",
        help="epd, e-pd, ep-d, epd1, dual-encoder:POLICY, vllm, vllm-ec; an epd system may name "
        "its encoders' devices after @, e.g. e-pd:adaptive@cuda/cpu (default epd,e-pd,vllm; "
        f"with --video {DEFAULT_VIDEO_SYSTEMS}: one, two and three encoders)",
    )
    parser.add_argument("--concurrency", default="1,4", help="levels (default 1,4)")
    parser.add_argument(
        "--rates",
        default="0",
        help="request rates in requests/s, comma separated (default 0: unpaced)",
    )
    parser.add_argument("--requests", type=int, default=16, help="requests per level")
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--images", type=int, default=1, help="images per request (default 1)")
    parser.add_argument(
        "--encoder-threads",
        default="",
        help="dual-encoder: CPU threads of each encoder, e.g. 2,1 makes the "
        "second slower (default: torch's default)",
    )
    parser.add_argument(
        "--split-ratio", default="", help="dual-encoder: per_request shares FAST:SLOW, e.g. 2:1"
    )
    parser.add_argument(
        "--cpu-layout",
        choices=LAYOUTS,
        default="auto",
        help="epd systems: how their services share the CPUs, as epd up's --cpu-layout "
        "(default auto)",
    )
    parser.add_argument(
        "--engine",
        choices=["auto", "vllm", "transformers"],
        default="auto",
        help="epd systems' prefill engine, as epd up's --engine (default auto: vllm when "
        "installed)",
    )
    parser.add_argument(
        "--video",
        action="store_true",
        help="a clip per request instead of pictures: epd with each system's encoders sharing "
        "the clip in chunks, against monolithic vLLM given the same decoded frames, and a "
        "repeated clip (scripts/e2e_video.py)",
    )
    parser.add_argument(
        "--clip-sizes",
        default="320x240,640x480",
        help="--video: the clips' frame sizes, WIDTHxHEIGHT, comma separated (default "
        "320x240,640x480)",
    )
    parser.add_argument(
        "--clip-seconds", type=float, default=6.0, help="--video: seconds per clip (default 6)"
    )
    parser.add_argument(
        "--clip-fps", type=int, default=10, help="--video: the clips' frame rate (default 10)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="--video: clips sent twice in a row, for the repeated clip's TTFT (default 4)",
    )
    parser.add_argument("--csv", default="bench_e2e.csv", help="CSV output ('' for none)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object of the figures instead of tables"
    )
    parsed = parser.parse_args()
    parsed.encoder_threads = tuple(parse_list(parsed.encoder_threads, int))
    parsed.clip_sizes = [size for size in parsed.clip_sizes.split(",") if size]
    parsed.systems = parsed.systems or (DEFAULT_VIDEO_SYSTEMS if parsed.video else "epd,e-pd,vllm")
    sys.exit(asyncio.run(main(parsed)))
