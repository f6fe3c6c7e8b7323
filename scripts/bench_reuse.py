"""Multimodal prefix routing benchmark: a multi-turn image chat over two prefill workers, TTFT
and prompt tokens computed under each prefill policy of the scheduler, in one run.

Topology E/PD in this process (each vLLM EngineCore in its own child process): one encoder,
two prefill+decode workers on two vLLM engines (prefix caching on, vLLM's default; KV blocks of
``--block-size`` tokens, 32 by default, the smallest vLLM's CPU attention takes and two of the
route's 16-token blocks, where vLLM's CPU default is 128), a route and a scheduler, over real
gRPC on loopback. The engines start once; for each policy
(``--policies``, default round_robin, longest_prefix (the choice before cache_aware) and
cache_aware) the scheduler, the encoder, the two workers' servers and the route start afresh
around them, and the requests carry a cache_salt of that policy's own, so no policy finds
another's blocks in vLLM's prefix cache, the encoder's cache or the scheduler's index.

Workload: ``--conversations`` chats at once, each about its own picture, each of ``--turns``
turns (a question, the answer of ``--tokens`` tokens added to the chat before the next); all
share one system prompt, ``--system short`` (a third of the first turn's prompt) or ``long``
(over half of it: the case that pulls a prefix router's every conversation to one worker).
Per policy: TTFT p50 and p99 over every turn and over the later turns (which could reuse the
earlier turns' KV), prompt tokens in all, and prompt tokens computed (not found in vLLM's
prefix cache: usage's cached_prompt_tokens, which the engine reports as num_cached_tokens),
and how the requests split over the two workers.

    .venv/bin/python scripts/bench_reuse.py [--preset tiny] [--conversations 8] [--turns 4]
                                            [--tokens 16] [--system short|long]
                                            [--block-size 32] [--policies ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

MODEL_ID = "bench"
IMAGE_SIZE = (448, 448)
SYSTEM = {
    # NOTE: a third of the first turn's prompt: conversations differ from their second block
    "short": "You are a careful assistant for a museum's picture archive.",
    # more than half of the first turn's prompt: every conversation starts with the same blocks
    "long": (
        "You are a careful assistant for a museum's picture archive. Describe what is shown "
        "plainly, name colours and shapes precisely, count objects when asked, say when you are "
        "unsure, and keep every answer short."
    ),
}
QUESTIONS = (
    "What is in this picture?",
    "Which colour covers most of it?",
    "Is there anything in the upper left corner?",
    "Count the distinct shapes you can see.",
    "Describe the lower half in one sentence.",
    "What would you title this picture?",
)
POLICIES = ("round_robin", "longest_prefix", "cache_aware")


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn: time to its first token, its prompt's tokens and how many of them
    vLLM found cached, and how the policy's requests split over the workers."""

    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    split: str


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (*IMAGE_SIZE, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class Deployment:
    """The servers of one policy around the shared engines."""

    def __init__(self, model_dir: Path, engines: list[Any], policy: str) -> None:
        self.model_dir, self.engines, self.policy = model_dir, engines, policy
        self.closers: list[Any] = []

    async def start(self) -> str:
        """Start every server; the route's endpoint once all workers registered."""
        from epd.scheduler.app import build_scheduler_server
        from epd.scheduler.config import SchedulerConfig
        from epd.server.encode.app import EncodeConfig, build_encode_server
        from epd.server.prefill.app import PrefillConfig, build_prefill_server
        from epd.server.route.app import RouteConfig, build_route_server

        config = SchedulerConfig(prefill_policy=self.policy)
        server, port = await build_scheduler_server(config=config)
        self.closers.append(lambda: server.drain_and_stop(0))
        self.scheduler = f"127.0.0.1:{port}"
        encoder = await build_encode_server(
            EncodeConfig(self.model_dir, model_id=MODEL_ID, scheduler=self.scheduler)
        )
        self.closers.insert(0, encoder.stop)
        for index, engine in enumerate(self.engines):
            config = PrefillConfig(self.model_dir, scheduler=self.scheduler, worker_id=f"pd{index}")
            prefill = await build_prefill_server(config, engine)
            self.closers.insert(0, prefill.stop)
        route = await build_route_server(RouteConfig(self.model_dir, self.scheduler, MODEL_ID))
        self.closers.insert(0, route.stop)
        await self._registered(1 + len(self.engines))
        return f"127.0.0.1:{route.port}"

    async def _registered(self, num_workers: int) -> None:
        from epd.common.channels import create_channel
        from epd.v1 import scheduler_service_pb2 as scheduler_pb
        from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc

        async with create_channel(self.scheduler) as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            for _ in range(600):
                listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
                if len(listing.workers) == num_workers:
                    return
                await asyncio.sleep(0.05)
        raise RuntimeError("the workers did not register")

    async def stop(self) -> None:
        for close in self.closers:
            await close()


async def converse(stub: Any, seed: int, args: argparse.Namespace, salt: str) -> list[Turn]:
    """One conversation about the picture of ``seed``; its turns in order."""
    num_turns, num_tokens, system = args.turns, args.tokens, SYSTEM[args.system]
    from epd.v1 import generation_pb2, multimodal_pb2
    from epd.v1 import route_service_pb2 as pb

    messages = [pb.ChatMessage(role="system", content=[pb.ContentPart(text=system)])]
    picture = pb.ContentPart(image=multimodal_pb2.MediaItem(data=png(seed)))
    sampling = generation_pb2.SamplingParams(
        max_tokens=num_tokens, ignore_eos=True, cache_salt=salt
    )
    turns = []
    for index in range(num_turns):
        question = pb.ContentPart(text=QUESTIONS[index % len(QUESTIONS)])
        parts = [picture, question] if index == 0 else [question]
        messages.append(pb.ChatMessage(role="user", content=parts))
        request = pb.GenerateRequest(model=MODEL_ID, messages=messages, sampling=sampling)
        start, first, text, usage = time.perf_counter(), 0.0, "", None
        async for response in stub.Generate(request, timeout=600):
            if not first and response.token_ids:
                first = time.perf_counter()
            text += response.text
            usage = response.usage if response.HasField("usage") else usage
        assert usage is not None
        turns.append(
            Turn(index, first - start, usage.prompt_tokens, usage.cached_prompt_tokens, "")
        )
        messages.append(pb.ChatMessage(role="assistant", content=[pb.ContentPart(text=text)]))
    return turns


async def run_policy(
    model_dir: Path,
    engines: list[CountingEngine],
    policy: str,
    args: argparse.Namespace,
    salt: str,
) -> list[Turn]:
    """Every conversation under ``policy`` at once (starts 0.1 s apart)."""
    from epd.common.channels import create_channel
    from epd.v1 import route_service_pb2_grpc

    deployment = Deployment(model_dir, engines, policy)
    endpoint = await deployment.start()
    try:
        async with create_channel(endpoint) as channel:
            stub = route_service_pb2_grpc.RouteServiceStub(channel)

            async def one(index: int) -> list[Turn]:
                await asyncio.sleep(0.1 * index)
                return await converse(stub, 1000 + index, args, salt)

            before = [engine.num_requests for engine in engines]
            chats = await asyncio.gather(*(one(i) for i in range(args.conversations)))
            split = "/".join(str(e.num_requests - n) for e, n in zip(engines, before, strict=True))
    finally:
        await deployment.stop()
    turns = [turn for chat in chats for turn in chat]
    return [Turn(t.turn, t.ttft_s, t.prompt_tokens, t.cached_tokens, split) for t in turns]


class CountingEngine:
    """An engine that counts the generations it was asked for (the requests its worker got)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.num_requests = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.num_requests += 1
        return self.engine.generate(*args, **kwargs)


def summary(turns: list[Turn]) -> dict[str, float]:
    ttft = sorted(turn.ttft_s * 1000 for turn in turns)
    later = sorted(turn.ttft_s * 1000 for turn in turns if turn.turn > 0)
    prompt = sum(turn.prompt_tokens for turn in turns)
    cached = sum(turn.cached_tokens for turn in turns)
    return {
        "requests": len(turns),
        "ttft_p50_ms": statistics.median(ttft),
        "ttft_p99_ms": percentile(ttft, 0.99),
        "later_turns_ttft_p50_ms": statistics.median(later) if later else 0.0,
        "prompt_tokens": prompt,
        "computed_tokens": prompt - cached,
        "cached_share": cached / prompt if prompt else 0.0,
    }


def percentile(ordered: list[float], fraction: float) -> float:
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions
    from epd.server.models.tiny.build import build_tiny_model, preset

    with tempfile.TemporaryDirectory() as folder:
        model_dir = build_tiny_model(Path(folder) / args.preset, preset(args.preset))
        overrides = {"block_size": args.block_size} if args.block_size else {}
        options = VllmOptions(kv_cache_bytes=256 << 20, max_model_len=4096, overrides=overrides)
        started = await asyncio.gather(
            *(VllmEngine.start(model_dir, model_id=MODEL_ID, options=options) for _ in "ab")
        )
        engines = [CountingEngine(engine) for engine in started]
        try:
            warm = argparse.Namespace(**{**vars(args), "conversations": 2, "turns": 1})
            await run_policy(model_dir, engines, "round_robin", warm, "warm-up")
            stamp = str(time.time_ns())
            results = {}
            for policy in args.policies.split(","):
                turns = await run_policy(model_dir, engines, policy, args, f"{policy}-{stamp}")
                results[policy] = {**summary(turns), "split": split_of(turns)}
        finally:
            for engine in engines:
                await engine.close()
    return {"preset": args.preset, "workload": workload(args), "policies": results}


def split_of(turns: list[Turn]) -> str:
    return turns[0].split if turns else ""


def workload(args: argparse.Namespace) -> dict[str, int | str]:
    """The run's settings, as the report shows them."""
    return {
        "conversations": args.conversations,
        "turns": args.turns,
        "tokens": args.tokens,
        "system": args.system,
        "block_size": args.block_size or 128,
    }


def report(figures: dict[str, Any]) -> None:
    print(f"preset {figures['preset']}, workload {figures['workload']}")
    print(
        f"{'policy':15} {'TTFT p50':>9} {'p99':>8} {'later p50':>10} {'prompt tok':>11} "
        f"{'computed':>9} {'cached':>7}"
    )
    for policy, row in figures["policies"].items():
        print(
            f"{policy:15} {row['ttft_p50_ms']:9.1f} {row['ttft_p99_ms']:8.1f} "
            f"{row['later_turns_ttft_p50_ms']:10.1f} {row['prompt_tokens']:11d} "
            f"{row['computed_tokens']:9d} {row['cached_share']:7.0%} {row['split']:>7}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="tiny model preset (default tiny)")
    parser.add_argument("--conversations", type=int, default=8, help="chats at once (8)")
    parser.add_argument("--turns", type=int, default=4, help="turns per chat (4)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (16)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="prefill policies")
    parser.add_argument(
        "--system",
        choices=sorted(SYSTEM),
        default="short",
        help="system prompt every chat shares: short (a third of the first prompt) or long "
        "(over half of it)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=32,
        help="vLLM's KV block size: 32 (default), two of the route's blocks and the smallest "
        "vLLM's CPU attention takes; 0 leaves vLLM's CPU default, 128, whose cache holds only "
        "whole blocks of 128 tokens",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (last line)")
    args = parser.parse_args()
    figures = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(figures))
    else:
        report(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
