"""Soak and chaos load: many streamed chat completions through the route's OpenAI HTTP port while
services are killed, with every answer checked against its reference, each service's memory
sampled, and the shared-memory segments left behind listed.

The deployment is started by ``epd up --keep --no-demo`` as a child process (the flags after
``--`` go to it: ``-- --topology e-pd --engine transformers --encoders 2``; its launcher
restarts a service that dies), or attached to with ``--url`` (``--endpoints-file``: the
file ``epd up --endpoints-file`` wrote, for its pids; without it, no kills and no memory). Before
the load, each distinct prompt (``--images`` pictures x 2 questions, greedy, ``--tokens`` tokens)
is answered once, one at a time: its reference. Then ``--requests`` requests go at
``--concurrency``, prompts in turn; a request is failed (HTTP error, error event, no [DONE],
broken connection) or corrupted (text other than its reference: a piece missing, repeated or
changed, or a usage count other than ``--tokens``).

``--kill ROLE@N[:SIGNAL]`` (repeatable; ROLE encoder, prefill, decode, scheduler or route;
SIGNAL KILL, the default, or TERM) signals one service of ROLE as request number N starts
(replicas of a role in turn), once the service of the kill before is back (restarted, and a
probe request answered; one kill at a time); ``--chaos`` kills each of encoder, prefill,
decode and scheduler with SIGKILL and then with SIGTERM, spread over the run. Requests in
flight at a kill are the moved ones: their latency p50/p99 is shown beside the others' (latencies
and TTFTs are of ok requests only). Memory: each service's RSS (its process tree, vLLM's engine
processes included) after the references (warm-up), every ``--sample-s`` and at the end, flat or
growing. Leaks: names in /dev/shm after the deployment stopped that were not there before it
started and that this deployment made (epd segments of its pids, names its processes were seen
mapping); other new names are listed, not counted. Exit status 1 when a request failed or was
corrupted or a segment leaked.

    .venv/bin/python scripts/bench_soak.py [--requests 10000] [--concurrency 64] [--tokens 16]
        [--images 4] [--kill encoder@100[:TERM]]... [--chaos] [--json]
        [--url URL [--endpoints-file FILE]] [-- EPD UP FLAGS: --topology e-pd --engine ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import soak_deploy
from soak_check import (
    Kill,
    chaos_schedule,
    parse_kill,
    transfer_state,
)
from soak_load import (
    Chaos,
    Fired,
    LoadOptions,
    chat_bodies,
    drive,
    model_id,
    references,
    stream_chat,
)
from soak_report import Soaked, is_clean, print_report, restarts, summarise, without_nan


async def sample_memory(
    served: soak_deploy.Served, samples: dict[str, list[tuple[int, int]]], every_s: float
) -> None:
    """Append each service's (pid, RSS) to ``samples`` every ``every_s`` until cancelled."""
    while True:
        for name, sample in served.memory().items():
            samples.setdefault(name, []).append(sample)
        await asyncio.sleep(every_s)


async def soak(args: argparse.Namespace, served: soak_deploy.Served) -> Soaked:
    """References, then the load with its kills and memory samples."""
    samples: dict[str, list[tuple[int, int]]] = {}
    back_s: list[float | None] = []

    def fire(kill: Kill) -> Fired:
        try:
            service, pid = served.kill(kill.role, kill.signum)
        except (RuntimeError, OSError) as e:
            log(args, f"  {kill.signal_name} to {kill.role} not sent: {e}")
            return Fired(kill, f"(no {kill.role})", 0, time.monotonic())
        log(args, f"  sent {kill.signal_name} to {service} (pid {pid}), at {kill.after_requests}")
        return Fired(kill, service, pid, time.monotonic())

    async def healed(previous: Fired) -> None:
        back_s.append(await back_again(args, served, session, bodies[0], previous, num_workers))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        bodies = chat_bodies(await model_id(session, served.url), args.images, args.tokens)
        answers = await references(session, served.url, bodies, args.timeout_s)
        num_workers = await soak_deploy.live_workers(served.endpoints().get("scheduler", ""))
        sampler = asyncio.create_task(sample_memory(served, samples, args.sample_s))
        options = LoadOptions(args.requests, args.concurrency, args.timeout_s, tuple(args.kills))
        start = time.monotonic()
        outcomes, fired = await drive(
            session, served.url, bodies, answers, options, Chaos(fire, healed)
        )
        elapsed = time.monotonic() - start
        if fired:
            await healed(fired[-1])
        sampler.cancel()
        transfers = await settled_transfers(session, served, args.heal_timeout_s)
    for name, sample in served.memory().items():
        samples.setdefault(name, []).append(sample)
    return Soaked(outcomes, fired, back_s, samples, start, elapsed, len(bodies), transfers)


async def settled_transfers(
    session: aiohttp.ClientSession, served: soak_deploy.Served, timeout_s: float
) -> dict[str, dict[str, float]]:
    """Each data-plane service's transfer figures once the load is over: read until no lease is
    outstanding anywhere (releases run in the background) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {}
        for name, url in sorted(served.metrics_urls().items()):
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as reply:
                    state = transfer_state(await reply.text())
            except (TimeoutError, aiohttp.ClientError):
                continue
            if state:
                states[name] = state
        outstanding = sum(s.get("leases_outstanding", 0) for s in states.values())
        if not outstanding or time.monotonic() > deadline:
            return states
        await asyncio.sleep(0.5)


async def back_again(
    args: argparse.Namespace,
    served: soak_deploy.Served,
    session: aiohttp.ClientSession,
    probe: dict[str, Any],
    kill: Fired,
    num_workers: int,
) -> float | None:
    """Seconds from ``kill`` until its service runs as another process, every service answers
    SERVING, the scheduler lists all ``num_workers`` workers again and a ``probe`` request is
    answered; None when it was not sent or is not back within ``--heal-timeout-s``. The next
    kill waits for it, so that each kill finds a replica of its role serving."""
    if not kill.pid:
        return None
    while time.monotonic() < kill.at + args.heal_timeout_s:
        if served.pids().get(kill.service, kill.pid) != kill.pid and await served.is_whole(
            num_workers
        ):
            answer = await stream_chat(session, served.url, probe, args.timeout_s)
            if not answer.error:
                return round(time.monotonic() - kill.at, 1)
        await asyncio.sleep(0.5)
    log(args, f"  {kill.service} not back {args.heal_timeout_s:.0f} s after its kill")
    return None


def run(args: argparse.Namespace, up_args: list[str]) -> dict[str, Any]:
    """Start (or attach to) the deployment, soak it, stop it, look for leaks."""
    before = soak_deploy.shm_names()
    work_dir = Path(tempfile.mkdtemp(prefix="epd-soak-"))
    if args.url:
        served = soak_deploy.Served(args.url.rstrip("/"), args.endpoints_file)
    else:
        log(args, f"starting epd up {' '.join(up_args)} (logs in {work_dir})")
        served = soak_deploy.start(up_args, work_dir, args.start_timeout_s)
    try:
        figures = summarise(args, asyncio.run(soak(args, served)))
    finally:
        launcher_status = None
        if served.launcher is not None:
            launcher_status = soak_deploy.stop_launcher(served.launcher)
    figures["deployment"] = args.url or " ".join(up_args)
    figures["launcher_exit"] = launcher_status
    figures["restarts"] = restarts(served.log)
    new = soak_deploy.shm_names() - before
    leaked = soak_deploy.ours(new, served.pids_seen, served.shm_mapped)
    attached = served.launcher is None
    figures["leaked_segments"] = None if attached else sorted(leaked)
    figures["new_shm_of_unknown_owner"] = None if attached else sorted(new - leaked)
    figures["logs"] = str(work_dir)
    return figures


def log(args: argparse.Namespace, message: str) -> None:
    print(message, file=sys.stderr if args.json else sys.stdout, flush=True)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's flags, and those after ``--`` for ``epd up``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests (default 10000)")
    parser.add_argument("--concurrency", type=int, default=64, help="at once (default 64)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (default 16)")
    parser.add_argument("--images", type=int, default=4, help="distinct pictures (default 4)")
    parser.add_argument(
        "--kill",
        dest="kills",
        action="append",
        type=parse_kill,
        default=[],
        metavar="ROLE@N[:SIGNAL]",
        help="signal one ROLE service as request N starts (repeatable)",
    )
    parser.add_argument(
        "--chaos", action="store_true", help="SIGKILL then SIGTERM each role once, spread"
    )
    parser.add_argument("--sample-s", type=float, default=10.0, help="memory sampling period")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="one request's limit")
    parser.add_argument(
        "--heal-timeout-s",
        type=float,
        default=180.0,
        help="the longest wait for a killed service to serve again before the next kill",
    )
    parser.add_argument("--start-timeout-s", type=float, default=900.0, help="epd up's limit")
    parser.add_argument("--url", help="attach to this OpenAI base URL instead of starting one")
    parser.add_argument("--endpoints-file", type=Path, help="with --url: epd up's endpoints")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    split = argv.index("--") if "--" in argv else len(argv)
    args, up_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if args.chaos:
        args.kills += chaos_schedule(args.requests)
    if not args.url and "--max-restarts" not in up_args:
        up_args += ["--max-restarts", str(max(3, len(args.kills)))]
    if args.kills and args.url and not args.endpoints_file:
        parser.error("--kill and --chaos need --endpoints-file with --url (for the pids)")
    return args, up_args


def main(argv: list[str]) -> int:
    args, up_args = parse_args(argv)
    # NOTE: SIGTERM (timeout, a CI runner) unwinds like Ctrl-C, so the deployment is stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    figures = run(args, up_args)
    if args.json:
        print(json.dumps(without_nan(figures)))
    else:
        print_report(figures)
    return 0 if is_clean(figures) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
