"""``epd prefill``: run a prefill worker on vLLM."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from epd.server.common.server import ServerOptions, serve
from epd.server.common.telemetry import add_telemetry_arguments, configure_from_args
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.prefill.service import Mode

DEFAULT_PORT = 50071
MiB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Prefill flags, then media, server and telemetry flags."""
    env = os.environ.get
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--model-id", default="",
                        help="model name clients use (default: the directory name)")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default="prefill_decode",
                        help="prefill_decode: aggregated prefill + decode from image embeddings; "
                             "encode_prefill: also takes raw images and encodes them itself "
                             "(default prefill_decode)")
    parser.add_argument("--worker-id", default=env("EPD_WORKER_ID", ""),
                        help="id in the scheduler's registry (env EPD_WORKER_ID)")
    parser.add_argument("--weight", type=float, default=1.0, help="share of work (default 1)")
    parser.add_argument("--scheduler", default=env("EPD_SCHEDULER"),
                        help="scheduler host:port to register with (env EPD_SCHEDULER)")
    parser.add_argument("--max-model-len", type=int, default=4096,
                        help="longest prompt + output in tokens (default 4096)")
    parser.add_argument("--kv-cache-mb", type=int, default=256,
                        help="KV cache size in MiB (default 256; vLLM's automatic sizing "
                             "fails on small CPU machines)")
    parser.add_argument("--max-pending", type=int, default=64,
                        help="requests admitted at once; more get RESOURCE_EXHAUSTED (default 64)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="model dtype (default float32)")  # fmt: skip
    MediaPolicy.add_arguments(parser)
    ServerOptions.add_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Start the engine, serve until SIGTERM/SIGINT, stop the engine."""
    if not (args.model / "config.json").exists():
        print(f"epd prefill: {args.model} is not a model directory (no config.json)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        options = ServerOptions.from_args(args)
        config = PrefillConfig(args.model, Mode(args.mode), args.worker_id, args.weight,
                               args.max_pending, args.scheduler, MediaPolicy.from_args(args))
    except ValueError as e:
        print(f"epd prefill: {e}", file=sys.stderr)
        return 2
    configure_from_args("epd-prefill", args)
    return asyncio.run(_serve(args, config, options))


async def _serve(args: argparse.Namespace, config: PrefillConfig, options: ServerOptions) -> int:
    from epd.server.engine.vllm_engine import VllmEngine, VllmOptions

    engine = await VllmEngine.start(args.model, model_id=args.model_id, options=VllmOptions(
        dtype=args.dtype, max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_mb * MiB, max_pending_requests=args.max_pending))
    try:
        app = await build_prefill_server(config, engine, options)
        print(f"epd prefill listening on {options.host}:{app.port} ({config.mode.value})",
              flush=True)  # fmt: skip
        await serve(app.server)
        app.worker.plane.close()
    finally:
        await engine.close()
    return 0
