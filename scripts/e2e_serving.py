"""The systems ``bench_e2e.py`` compares, started and stopped: an epd topology by the ``epd up``
launcher (its services pinned to CPUs as ``epd up --cpu-layout`` pins them, its metrics scraped
every second when named with ``+metrics``), monolithic vLLM or vLLM's own encoder split."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from vllm_servers import start_vllm, start_vllm_ec

from epd.common.cpus import allowed_cpus
from epd.launch.cpu_layout import describe, lay_out
from epd.launch.launcher import Deployment, start_topology
from epd.launch.topology import Topology
from epd.server.engine.device import resolve_device


@contextlib.asynccontextmanager
async def serving(
    system: str,
    model_dir: Path,
    run_dir: Path,
    args: argparse.Namespace,
    more_env: dict[str, str] | None = None,
    vllm_flags: tuple[str, ...] = (),
) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """Start ``system`` (every process with ``more_env``, monolithic vLLM with ``vllm_flags``);
    yield its OpenAI base URL and its processes (name: pid); stop it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        **(more_env or {}),
    }
    system, metrics, _ = system.partition("+metrics")
    deployment = Deployment(run_dir, env, metrics=bool(metrics))
    scraper: asyncio.Task[None] | None = None
    try:
        if system in ("vllm", "vllm-ec"):
            if system == "vllm":
                url = await start_vllm(deployment, model_dir, "vllm", *vllm_flags)
            else:
                url = await start_vllm_ec(deployment, model_dir)
            yield url, {c.name: c.process.pid for c in deployment.children}
        else:
            system, _, devices = system.partition("@")
            name, _, policy = system.partition(":")
            dual = name == "dual-encoder"
            topology = Topology(
                name,
                policy=policy or "adaptive",
                split_ratio=args.split_ratio if dual or devices else "",
                encoder_threads=args.encoder_threads if dual else (),
                devices=tuple(device for device in devices.split("/") if device),
                engine=args.engine,
            )
            accelerator = resolve_device("auto") != "cpu"
            plan = lay_out(topology.services(accelerator), allowed_cpus(), args.cpu_layout, {})
            log(args, f"{system}: CPUs: {describe(plan)}")
            topology = topology.with_cpus(plan)
            route = await start_topology(deployment, model_dir, "tiny", topology)
            urls = [c.metrics_url for c in deployment.children if c.metrics_url]
            scraper = asyncio.create_task(scrape_every_second(urls)) if urls else None
            processes = {c.name: c.process.pid for c in deployment.children}
            yield f"http://127.0.0.1:{route.http_port}/v1", processes
    finally:
        if scraper is not None:
            scraper.cancel()
        deployment.stop()


async def scrape_every_second(urls: list[str]) -> None:
    """Read every service's metrics once a second, as a Prometheus with a 1 s interval would."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while True:
            for url in urls:
                async with session.get(url) as response:
                    await response.read()
            await asyncio.sleep(1.0)


def log(args: argparse.Namespace, message: str) -> None:
    print(message, file=sys.stderr if args.json else sys.stdout, flush=True)
