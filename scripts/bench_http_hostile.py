"""Hostile bodies against a running route's OpenAI HTTP port: route RSS and /health latency.

Sends each body once (one at a time) to ``/v1/chat/completions`` while a second task asks
``/health`` every 50 ms, and samples the route process's resident memory every 50 ms. Prints,
per body: the answer's status and time, the route's peak RSS and RSS after the request, and the
worst /health latency seen while the body was being served.

    .venv/bin/epd up --topology e-pd --engine transformers --keep --no-demo \
        --endpoints-file /tmp/ep.json &
    .venv/bin/python scripts/bench_http_hostile.py --endpoints-file /tmp/ep.json [--json]

``--mb`` sets the size of each body (default 60 MB, under the old 64 MiB cap).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

MB = 1_000_000


def text_body(size: int) -> bytes:
    """One user message whose text fills the body (tokenising it is the expensive part)."""
    head = b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    return head + b"word " * ((size - len(head) - len(tail)) // 5) + tail


def containers_body(size: int) -> bytes:
    """Millions of empty JSON arrays in an ignored field (each a Python object once parsed)."""
    head = b'{"model": "tiny", "max_tokens": 4, "metadata": ['
    tail = b'[]], "messages": [{"role": "user", "content": "hi"}]}'
    return head + b"[]," * ((size - len(head) - len(tail)) // 3) + tail


def stop_ids_body(size: int) -> bytes:
    """Millions of stop token ids (each a Python int, then a protobuf repeated field)."""
    head = b'{"model": "tiny", "max_tokens": 4, "stop_token_ids": ['
    tail = b'1], "messages": [{"role": "user", "content": "hi"}]}'
    return head + b"1," * ((size - len(head) - len(tail)) // 2) + tail


def deep_body(size: int) -> bytes:
    """JSON nested 100,000 deep."""
    return b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


BODIES: dict[str, Callable[[int], bytes]] = {
    "text": text_body,
    "containers": containers_body,
    "stop_token_ids": stop_ids_body,
    "nested 100k deep": deep_body,
}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def probe_health(url: str, worst: list[float], stop: threading.Event) -> None:
    """Ask /health every 50 ms from a thread of its own (the sender's loop does not delay it)."""
    parts = urllib.parse.urlsplit(url)
    while not stop.is_set():
        start = time.perf_counter()
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=600)
        try:
            connection.request("GET", "/health")
            connection.getresponse().read()
        except OSError:
            pass
        finally:
            connection.close()
        worst.append(time.perf_counter() - start)
        stop.wait(0.05)


async def sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak.append(rss_bytes(pid))
        await asyncio.sleep(0.05)


async def send(
    url: str, pid: int, name: str, body: bytes, headers: dict[str, str]
) -> dict[str, Any]:
    stop = asyncio.Event()
    health: list[float] = []
    rss: list[int] = [rss_bytes(pid)]
    probe_stop = threading.Event()
    probe = threading.Thread(target=probe_health, args=(url, health, probe_stop), daemon=True)
    probe.start()
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(sample_rss(pid, rss, stop))]
        start = time.perf_counter()
        try:
            async with session.post(
                url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json", **headers},
                timeout=aiohttp.ClientTimeout(total=900),
            ) as response:
                status, answer = response.status, (await response.text())[:160]
        except aiohttp.ClientError as e:
            status, answer = 0, f"{type(e).__name__}: {e}"[:160]
        seconds = time.perf_counter() - start
        await asyncio.sleep(0.3)
        stop.set()
        probe_stop.set()
        await asyncio.gather(*tasks)
        await asyncio.to_thread(probe.join)
    return {
        "body": name,
        "mb": round(len(body) / MB, 1),
        "status": status,
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(max(rss) / MB),
        "rss_after_mb": round(rss_bytes(pid) / MB),
        "health_worst_ms": round(1000 * max(health or [0.0]), 1),
        "answer": answer,
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    endpoints = json.loads(Path(args.endpoints_file).read_text())
    url = endpoints["http"].rstrip("/").removesuffix("/v1")
    pid = int(endpoints["pids"]["route"])
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    rows = []
    for name, build in BODIES.items():
        if args.only and name not in args.only:
            continue
        rows.append(await send(url, pid, name, build(int(args.mb * MB)), headers))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--endpoints-file",
        required=True,
        help="JSON written by `epd up --endpoints-file` (needs http and pids)",
    )
    parser.add_argument("--mb", type=float, default=60.0, help="size of each body in MB")
    parser.add_argument("--token", default="", help="bearer token, if the route asks for one")
    parser.add_argument("--only", nargs="*", choices=sorted(BODIES), help="bodies to send")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps({"bodies": rows}))
        return 0
    print(
        f"{'body':18} {'MB':>5} {'status':>6} {'s':>8} {'peak RSS MB':>11} "
        f"{'RSS after MB':>12} {'worst /health ms':>16}"
    )
    for r in rows:
        print(
            f"{r['body']:18} {r['mb']:5} {r['status']:6} {r['seconds']:8} "
            f"{r['peak_rss_mb']:11} {r['rss_after_mb']:12} {r['health_worst_ms']:16}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
