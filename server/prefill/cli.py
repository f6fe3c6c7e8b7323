"""``epd prefill``: run a prefill worker on vLLM, or on transformers where vLLM is absent."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epd.server.common.model_dir import require_model_dir
from epd.server.common.server import ServerOptions, serve
from epd.server.common.telemetry import add_telemetry_arguments, configure_from_args
from epd.server.engine.vllm_inputs import MIN_KV_LEASE_S
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.prefill.service import Mode

if TYPE_CHECKING:
    from epd.server.engine.base import Engine

DEFAULT_PORT = 50071
MiB = 1 << 20
ENGINES = ("auto", "vllm", "transformers")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM engine flags shared by ``epd prefill`` and ``epd decode``."""
    env = os.environ.get
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--model-id", default="",
                        help="model name clients use (default: the directory name)")
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
                        help="model dtype (default float32)")
    parser.add_argument("--kv-host", default=env("EPD_KV_HOST", "127.0.0.1"),
                        help="address of this worker's NIXL KV handshake listener, reachable by "
                             "its peers (env EPD_KV_HOST, default 127.0.0.1)")
    parser.add_argument("--kv-port", type=int, default=int(env("EPD_KV_PORT", "0")),
                        help="port of the NIXL handshake listener (env EPD_KV_PORT; "
                             "default 0: a free port)")
    parser.add_argument("--kv-lease-s", type=int, default=int(env("EPD_KV_LEASE_S", "30")),
                        help="seconds a prefill worker keeps KV blocks no decode worker has read "
                             "(a request cancelled between prefill and decode); the same on "
                             "prefill and decode workers, at least 6 (env EPD_KV_LEASE_S, "
                             "default 30)")  # fmt: skip


def check_engine_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the first engine flag with a value no engine accepts."""
    require_model_dir(args.model)
    if args.kv_lease_s < MIN_KV_LEASE_S:
        raise ValueError(f"--kv-lease-s must be at least {MIN_KV_LEASE_S} (decode workers renew "
                         f"the lease every lease/6 s), got {args.kv_lease_s}")  # fmt: skip
    for flag in ("max_model_len", "kv_cache_mb", "max_pending"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")


def engine_options(args: argparse.Namespace, kv_role: str | None) -> Any:
    """VllmOptions from the engine flags."""
    from epd.server.engine.vllm_engine import VllmOptions
    from epd.server.engine.vllm_inputs import SideChannel

    return VllmOptions(dtype=args.dtype, max_model_len=args.max_model_len,
                       kv_cache_bytes=args.kv_cache_mb * MiB,
                       max_pending_requests=args.max_pending, kv_role=kv_role,
                       side_channel=SideChannel(args.kv_host, args.kv_port),
                       kv_lease_s=args.kv_lease_s)  # fmt: skip


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(name: str, hands_off_kv: bool) -> str:
    """``vllm`` or ``transformers`` for ``--engine name``; ValueError when it cannot serve."""
    has_vllm = vllm_installed()
    if name == "auto":
        name = "vllm" if has_vllm else "transformers"
    if name == "vllm" and not has_vllm:
        raise ValueError("--engine vllm: vLLM is not installed (scripts/install.sh installs "
                         "it; --engine transformers runs without it)")  # fmt: skip
    if name == "transformers" and hands_off_kv:
        raise ValueError("the transformers engine does not hand its KV cache to decode workers; "
                         "use --engine vllm, or --mode prefill_decode / encode_prefill without "
                         "--kv-transfer")  # fmt: skip
    return name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Prefill flags, then engine, media, server and telemetry flags."""
    parser.add_argument("--mode", choices=[m.value for m in Mode], default="prefill_decode",
                        help="prefill: first token + KV handle for a decode worker; "
                             "prefill_decode: aggregated prefill + decode from image embeddings; "
                             "encode_prefill: also takes raw images and encodes them itself "
                             "(default prefill_decode)")
    parser.add_argument("--kv-transfer", action="store_true",
                        help="encode_prefill: also serve Prefill, handing KV to decode workers "
                             "(EP/D); implied by --mode prefill")  # fmt: skip
    parser.add_argument("--engine", choices=ENGINES, default=os.environ.get("EPD_ENGINE", "auto"),
                        help="vllm: vLLM's engine (KV hand-off, batching); transformers: the "
                             "model's transformers code in-process (aggregated modes only, "
                             "no vLLM needed); auto: vllm when installed (env EPD_ENGINE, "
                             "default auto)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the transformers engine (default cpu; vLLM "
                             "picks its own)")  # fmt: skip
    add_engine_arguments(parser)
    MediaPolicy.add_arguments(parser)
    ServerOptions.add_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Start the engine, serve until SIGTERM/SIGINT, stop the engine."""
    try:
        check_engine_arguments(args)
        options = ServerOptions.from_args(args)
        mode = Mode(args.mode)
        config = PrefillConfig(args.model, mode, args.worker_id, args.weight, args.max_pending,
                               args.scheduler, MediaPolicy.from_args(args),
                               hands_off_kv=args.kv_transfer or mode is Mode.PREFILL)  # fmt: skip
        args.engine = resolve_engine(args.engine, config.hands_off_kv)
    except ValueError as e:
        print(f"epd prefill: {e}", file=sys.stderr)
        return 2
    configure_from_args("epd-prefill", args)
    return asyncio.run(_serve(args, config, options))


async def _serve(args: argparse.Namespace, config: PrefillConfig, options: ServerOptions) -> int:
    engine = await _start_engine(args, config)
    try:
        try:
            app = await build_prefill_server(config, engine, options)
        except ValueError as e:
            print(f"epd prefill: {e}", file=sys.stderr)
            return 2
        print(f"epd prefill listening on {options.host}:{app.port} ({config.mode.value}, "
              f"{args.engine})", flush=True)  # fmt: skip
        await serve(app.server)
        app.worker.plane.close()
    finally:
        await engine.close()
    return 0


async def _start_engine(args: argparse.Namespace, config: PrefillConfig) -> Engine:
    if args.engine == "transformers":
        from epd.server.engine.transformers_engine import TransformersEngine, TransformersOptions

        options = TransformersOptions(device=args.device, dtype=args.dtype,
                                      max_model_len=args.max_model_len,
                                      kv_cache_bytes=args.kv_cache_mb * MiB,
                                      max_pending_requests=args.max_pending)  # fmt: skip
        return await TransformersEngine.start(args.model, model_id=args.model_id, options=options)
    from epd.server.engine.vllm_engine import VllmEngine

    kv_role = "kv_producer" if config.hands_off_kv else None
    return await VllmEngine.start(args.model, model_id=args.model_id,
                                  options=engine_options(args, kv_role))  # fmt: skip
