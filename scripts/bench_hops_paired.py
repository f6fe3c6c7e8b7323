"""Two checkouts' E/PD deployments timed against each other on one machine, in one run: both up
at once, each request sent to one and then the same request to the other (which goes first
alternates), so the load other work puts on the machine falls on both alike. Prints each one's
TTFT p50 and p90 and its hop table (``bench_hops.hop_table``), and the median of the paired
differences (second checkout minus first). A checkout is a directory holding this repository
(e.g. ``git worktree add /tmp/before <rev>``); each deployment imports the ``epd`` of its own.

    .venv/bin/python scripts/bench_hops_paired.py BEFORE AFTER [--requests 60] [--gap-s 0.3]
        [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_e2e import one_request, pictures_of, tiny_model_dir
from bench_hops import SPAN_FILE, WARM_UP, hop_table


async def serve(model_dir: Path, run_dir: Path) -> None:
    """One E/PD deployment of the ``epd`` this process imports, traced into ``run_dir``; prints
    its HTTP port and stops when its standard input closes."""
    from epd.launch.launcher import Deployment, start_topology
    from epd.launch.topology import Topology

    env = {
        **os.environ,
        "EPD_TRACE_EXPORTER": f"json:{run_dir / SPAN_FILE}",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    (run_dir / "epd").mkdir(parents=True)
    deployment = Deployment(run_dir / "epd", env)
    try:
        route = await start_topology(deployment, model_dir, "tiny", Topology("e-pd"))
        print(route.http_port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        deployment.stop()


def package_of(checkout: Path, into: Path) -> Path:
    """A tree shaped like the installed package whose folders are ``checkout``'s (as
    ``scripts/typecheck.sh`` builds one): a process importing ``epd`` from it runs that
    checkout."""
    package = into / "package" / "epd"
    package.mkdir(parents=True)
    for folder in ("server", "common", "client", "launch", "scheduler"):
        (package / folder).symlink_to(checkout / folder)
    for item in (checkout / "epd").iterdir():
        if not (package / item.name).exists():
            (package / item.name).symlink_to(item)
    return package.parent


def start(checkout: Path, model_dir: Path, run_dir: Path) -> subprocess.Popen[str]:
    """``serve`` in a process that imports ``checkout``'s ``epd``."""
    package = package_of(checkout, run_dir)
    env = {**os.environ, "PYTHONPATH": str(package)}
    command = [sys.executable, __file__, "--serve", str(model_dir), str(run_dir)]
    # NOTE: run from the package: ``python -m`` children put their directory first on the path
    return subprocess.Popen(
        command, env=env, cwd=package, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


async def paired(args: argparse.Namespace) -> dict[str, Any]:
    import openai

    model_dir = (args.model or tiny_model_dir()).resolve()
    run_dir = Path(tempfile.mkdtemp(prefix="epd-paired-"))
    names = [str(path) for path in (args.before, args.after)]
    servers = [start(Path(n).resolve(), model_dir, run_dir / str(i)) for i, n in enumerate(names)]
    timed: list[list[tuple[float, float, float]]] = [[], []]
    try:
        ports = [int(server.stdout.readline()) for server in servers]  # type: ignore[union-attr]
        clients = [
            openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="-", timeout=120)
            for p in ports
        ]
        for index in range(WARM_UP + args.requests):
            for side in (index % 2, 1 - index % 2):
                await asyncio.sleep(args.gap_s)
                sent = time.time()
                content = pictures_of(1000 + index, 1)
                first, total, _ = await one_request(clients[side], "tiny", content, tokens=16)
                if index >= WARM_UP:
                    timed[side].append((sent, first, total))
    finally:
        for server in servers:
            server.communicate(timeout=120)
    figures: dict[str, Any] = {"requests": args.requests}
    for side, name in enumerate(names):
        ttfts = [first * 1000 for _, first, _ in timed[side]]
        figures[name] = {
            "ttft_p50_ms": statistics.median(ttfts),
            "ttft_p90_ms": statistics.quantiles(ttfts, n=10)[-1],
            "hops": hop_table(run_dir / str(side) / SPAN_FILE, timed[side]),
        }
    differences = [(a[1] - b[1]) * 1000 for b, a in zip(timed[0], timed[1], strict=True)]
    figures["paired_difference_p50_ms"] = statistics.median(differences)
    return figures


def print_figures(figures: dict[str, Any]) -> None:
    for name, side in figures.items():
        if not isinstance(side, dict):
            continue
        print(f"{name}: TTFT p50 {side['ttft_p50_ms']:.1f} ms, p90 {side['ttft_p90_ms']:.1f} ms")
        for row in side["hops"]:
            print(
                f"  {row['service']:<14} {row['side']:<7} {row['rpc']:<22} "
                f"{row['start_ms']:>7.1f} {row['end_ms']:>7.1f} {row['count']:>4}"
            )
    difference = figures["paired_difference_p50_ms"]
    print(f"median paired difference (after - before): {difference:+.1f} ms")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(Path(sys.argv[2]), Path(sys.argv[3])))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="checkout timed first in the pairs' order")
    parser.add_argument("after", type=Path, help="checkout compared with it")
    parser.add_argument("--requests", type=int, default=60, help="pairs measured (default 60)")
    parser.add_argument("--gap-s", type=float, default=0.3, help="idle before each request")
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    print_figures(asyncio.run(paired(parser.parse_args())))
