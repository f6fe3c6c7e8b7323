"""What a CPU KV engine loses when its threads share one CPU: prefill time of a vLLM KV-producer
engine with ``--threads`` model threads, its EngineCore's threads on every CPU this process may
use (what ``vllm_process.keep_on_cpus`` leaves) against all of them on the last CPU (where vLLM's
NIXL connector put them before), alternated in one run.

    .venv/bin/python scripts/bench_engine_cpus.py [--threads 2] [--tokens 3000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from bench_e2e import tiny_model_dir

from epd.common.cpus import allowed_cpus, pin_threads
from epd.server.engine.base import Sampling
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_options import VllmOptions
from epd.server.engine.vllm_process import engine_core_pids

ROUNDS = 3
PER_ROUND = 8


async def main(args: argparse.Namespace) -> dict[str, float]:
    model_dir = tiny_model_dir()
    options = VllmOptions(
        kv_role="kv_producer",
        kv_cache_bytes=256 << 20,
        max_model_len=args.tokens + 64,
        cpu_threads=args.threads,
    )
    engine = await VllmEngine.start(model_dir, model_id="tiny", options=options)
    pids = engine_core_pids(engine._llm)
    layouts = {"every_cpu": allowed_cpus(), "last_cpu": allowed_cpus()[-1:]}

    async def prefill_ms(seed: int) -> float:
        prompt = [(seed * 7919 + i * 31) % 200 + 10 for i in range(args.tokens)]
        start = time.perf_counter()
        async for _ in engine.generate(f"r{seed}", prompt, [], Sampling(max_tokens=1)):
            pass
        return (time.perf_counter() - start) * 1000

    times: dict[str, list[float]] = {name: [] for name in layouts}
    try:
        await prefill_ms(-1)
        seed = 0
        for _ in range(ROUNDS):
            for name, cpus in layouts.items():
                for pid in pids:
                    pin_threads(pid, cpus)
                for _ in range(PER_ROUND):
                    seed += 1
                    times[name].append(await prefill_ms(seed))
    finally:
        await engine.close()
    return {f"{name}_prefill_ms": statistics.median(values) for name, values in times.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="model threads (default 2)")
    parser.add_argument("--tokens", type=int, default=3000, help="prompt tokens (default 3000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parsed = parser.parse_args()
    figures = asyncio.run(main(parsed))
    if parsed.json:
        print(json.dumps(figures))
    else:
        every, last = figures["every_cpu_prefill_ms"], figures["last_cpu_prefill_ms"]
        print(f"prefill of {parsed.tokens} tokens, {parsed.threads} threads, p50:")
        print(f"  EngineCore threads on every CPU: {every:8.1f} ms")
        print(f"  all on the last CPU (before):    {last:8.1f} ms ({last / every:.1f}x)")
