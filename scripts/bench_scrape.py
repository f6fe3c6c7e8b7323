"""What one Prometheus scrape costs each service of a running deployment: lines exposed, wall
time, and the service's CPU time per scrape (its process and children, from /proc, less what it
spends idle over the same time). Start a deployment with metrics (``epd up --keep
--endpoints-file EP.json``), then:

    .venv/bin/python scripts/bench_scrape.py EP.json [--scrapes 300] [--json]

The overhead of scraping every ``I`` seconds is the sum of the CPU column divided by ``I``
seconds times the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from process_cpu import tree_cpu_seconds

IDLE_WINDOW_S = 5.0


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        body: bytes = reply.read()
        return body


def measure(name: str, url: str, pid: int, num_scrapes: int) -> dict[str, Any]:
    """One service: idle CPU rate first, then ``num_scrapes`` scrapes back to back."""
    idle_start = tree_cpu_seconds(pid)
    time.sleep(IDLE_WINDOW_S)
    idle_rate = (tree_cpu_seconds(pid) - idle_start) / IDLE_WINDOW_S
    lines = len(scrape(url).splitlines())
    start_cpu, start = tree_cpu_seconds(pid), time.perf_counter()
    for _ in range(num_scrapes):
        scrape(url)
    elapsed = time.perf_counter() - start
    used = tree_cpu_seconds(pid) - start_cpu - idle_rate * elapsed
    return {
        "service": name,
        "lines": lines,
        "wall_ms": round(1000 * elapsed / num_scrapes, 3),
        "cpu_ms": round(1000 * max(0.0, used) / num_scrapes, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoints", type=Path, help="epd up's --endpoints-file")
    parser.add_argument("--scrapes", type=int, default=300, help="scrapes per service")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    endpoints = json.loads(args.endpoints.read_text())
    if not endpoints.get("metrics"):
        print(f"{args.endpoints}: no metrics URLs (was epd up run with --no-metrics?)")
        return 2
    rows = [
        measure(name, url, endpoints["pids"][name], args.scrapes)
        for name, url in endpoints["metrics"].items()
    ]
    total = sum(r["cpu_ms"] for r in rows)
    cores = len(os.sched_getaffinity(0))
    share = total / 1000 / cores
    if args.json:
        print(json.dumps({"rows": rows, "cpu_ms_per_round": total, "cores": cores}))
        return 0
    print(f"{'service':<12}{'lines':>7}{'wall ms':>10}{'CPU ms':>9}")
    for r in rows:
        print(f"{r['service']:<12}{r['lines']:>7}{r['wall_ms']:>10.2f}{r['cpu_ms']:>9.2f}")
    print(
        f"one round: {total:.2f} ms of CPU; scraped every second, that is "
        f"{100 * share:.2f} % of {cores} cores"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
