"""Where one request's time to first token goes at low load: each RPC of an epd deployment on
one time line, against monolithic vLLM on the same requests, in one run.

Starts an epd topology (``--topology``, default e-pd) through the ``epd up`` launcher with every
service writing its spans to a JSON-lines file, sends ``--requests`` chat requests one at a time
(``--gap-s`` apart, one random 224x224 picture each, 16 output tokens, streamed through the
OpenAI API), and places every span of each request on the client's clock (same machine, same
wall clock): the median start and end of each RPC, as the route (client side) and its server
see it, the median time of each span event within them (the prefill worker's images resolved and
first token, the route's first token), and the first token at the client. It then measures two
floors of this machine: a bare gRPC health check to the scheduler, and ~5 ms of one thread's
numpy work, each back to back and after the same idle gap (waking from idle costs every
process of the pipeline, which monolithic vLLM pays once). With
``--vllm`` monolithic vLLM answers the same requests afterwards, for the reference TTFT.

    .venv/bin/python scripts/bench_hops.py [--model DIR] [--topology e-pd] [--requests 30]
        [--gap-s 0.3] [--vllm] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
from bench_e2e import one_request, pictures_of, tiny_model_dir
from grpc_health.v1 import health_pb2, health_pb2_grpc
from vllm_servers import start_vllm

from epd.launch.launcher import Deployment, start_topology
from epd.launch.topology import Topology

SPAN_FILE = "spans.jsonl"
WARM_UP = 3


async def timed_requests(
    base_url: str, num_requests: int, gap_s: float, first_seed: int
) -> list[tuple[float, float, float]]:
    """(wall-clock send time, TTFT s, total s) of requests sent one at a time."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="-", timeout=120)
    results = []
    for index in range(WARM_UP + num_requests):
        pictures = pictures_of(first_seed + index, 1)
        await asyncio.sleep(gap_s)
        sent = time.time()
        first, total, _ = await one_request(client, "tiny", pictures, tokens=16)
        if index >= WARM_UP:
            results.append((sent, first, total))
    await client.close()
    return results


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def hop_table(spans_path: Path, requests: list[tuple[float, float, float]]) -> list[dict[str, Any]]:
    """Median start and end (ms after the client sent the request) of each (service, side,
    RPC) in the traces of ``requests``, and the time of each span event (start = end)."""
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in spans_path.read_text().splitlines():
        span = json.loads(line)
        traces[span["context"]["trace_id"]].append(span)
    starts = sorted(
        ((min(_seconds(s["start_time"]) for s in spans), spans) for spans in traces.values()),
        key=lambda start: start[0],
    )
    marks: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for sent, _, total in requests:
        mine = [spans for start, spans in starts if sent <= start <= sent + total]
        if len(mine) != 1:
            continue
        for span in mine[0]:
            key = (
                span["resource"]["attributes"]["service.name"],
                span["kind"].removeprefix("SpanKind.").lower(),
                span["name"].rsplit("/", 1)[-1],
            )
            begin = (_seconds(span["start_time"]) - sent) * 1000
            end = (_seconds(span["end_time"]) - sent) * 1000
            marks[key].append((begin, end))
            for event in span.get("events", ()):
                at = (_seconds(event["timestamp"]) - sent) * 1000
                marks[(key[0], key[1], f"  {event['name']}")].append((at, at))
    rows = [
        {
            "service": service,
            "side": side,
            "rpc": name,
            "count": len(values),
            "start_ms": statistics.median(v[0] for v in values),
            "end_ms": statistics.median(v[1] for v in values),
        }
        for (service, side, name), values in marks.items()
    ]
    return sorted(rows, key=lambda row: row["start_ms"])


async def health_round_trips(endpoint: str, gap_s: float, count: int = 50) -> dict[str, float]:
    """Median ms of a bare gRPC health check: back to back, and after ``gap_s`` idle."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        await stub.Check(request)
        busy, idle = [], []
        for _ in range(count):
            start = time.perf_counter()
            await stub.Check(request)
            busy.append((time.perf_counter() - start) * 1000)
        for _ in range(count):
            await asyncio.sleep(gap_s)
            start = time.perf_counter()
            await stub.Check(request)
            idle.append((time.perf_counter() - start) * 1000)
    return {"back_to_back_ms": statistics.median(busy), "after_gap_ms": statistics.median(idle)}


def compute_after_gap(gap_s: float, count: int = 30) -> dict[str, float]:
    """Median ms of the same ~5 ms of single-threaded numpy work: back to back, and after
    ``gap_s`` asleep (what waking from idle costs any process on this machine)."""
    import numpy as np

    matrix = np.random.default_rng(0).random((160, 160))

    def work() -> float:
        start = time.perf_counter()
        for _ in range(40):
            matrix @ matrix
        return (time.perf_counter() - start) * 1000

    busy = [work() for _ in range(count)]
    idle = []
    for _ in range(count):
        time.sleep(gap_s)
        idle.append(work())
    return {"back_to_back_ms": statistics.median(busy), "after_gap_ms": statistics.median(idle)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = (args.model or tiny_model_dir()).resolve()
    run_dir = Path(tempfile.mkdtemp(prefix="epd-hops-"))
    env = {
        **os.environ,
        "EPD_TRACE_EXPORTER": f"json:{run_dir / SPAN_FILE}",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    figures: dict[str, Any] = {"topology": args.topology, "requests": args.requests}
    (run_dir / "epd").mkdir()
    deployment = Deployment(run_dir / "epd", env)
    try:
        route = await start_topology(deployment, model_dir, "tiny", Topology(args.topology))
        url = f"http://127.0.0.1:{route.http_port}/v1"
        requests = await timed_requests(url, args.requests, args.gap_s, 1000)
        scheduler = next(c for c in deployment.children if c.name == "scheduler")
        figures["floor"] = await health_round_trips(scheduler.endpoint, args.gap_s)
    finally:
        deployment.stop()
    figures["compute"] = compute_after_gap(args.gap_s)
    figures["ttft_ms"] = statistics.median(r[1] for r in requests) * 1000
    figures["hops"] = hop_table(run_dir / SPAN_FILE, requests)
    if args.vllm:
        (run_dir / "vllm").mkdir()
        reference = Deployment(run_dir / "vllm", env)
        try:
            url = await start_vllm(reference, model_dir)
            answered = await timed_requests(url, args.requests, args.gap_s, 1000)
        finally:
            reference.stop()
        figures["vllm_ttft_ms"] = statistics.median(r[1] for r in answered) * 1000
    return figures


def print_figures(figures: dict[str, Any]) -> None:
    print(f"{figures['topology']}: {figures['requests']} requests one at a time, medians, ms")
    print("after the client sent it (route: client side of each call; others: server side)")
    print(f"{'service':<14} {'side':<7} {'rpc':<22} {'start':>7} {'end':>7} {'n':>4}")
    for row in figures["hops"]:
        print(
            f"{row['service']:<14} {row['side']:<7} {row['rpc']:<22} "
            f"{row['start_ms']:>7.1f} {row['end_ms']:>7.1f} {row['count']:>4}"
        )
    print(f"first token at the client: {figures['ttft_ms']:.1f}")
    if "vllm_ttft_ms" in figures:
        ratio = figures["ttft_ms"] / figures["vllm_ttft_ms"]
        print(f"monolithic vLLM, same requests: {figures['vllm_ttft_ms']:.1f} (epd {ratio:.2f}x)")
    floor = figures["floor"]
    print(
        f"bare gRPC health check to the scheduler: {floor['back_to_back_ms']:.2f} back to back, "
        f"{floor['after_gap_ms']:.2f} after the same gap"
    )
    compute = figures["compute"]
    print(
        f"~5 ms of numpy work in one thread: {compute['back_to_back_ms']:.2f} back to back, "
        f"{compute['after_gap_ms']:.2f} after sleeping the same gap"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--topology", default="e-pd", help="epd topology (default e-pd)")
    parser.add_argument("--requests", type=int, default=30, help="requests measured (default 30)")
    parser.add_argument("--gap-s", type=float, default=0.3, help="idle between requests (0.3)")
    parser.add_argument("--vllm", action="store_true", help="also time monolithic vLLM")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parsed = parser.parse_args()
    result = asyncio.run(main(parsed))
    if parsed.json:
        print(json.dumps(result))
    else:
        print_figures(result)
    sys.exit(0)
