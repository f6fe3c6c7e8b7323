"""``epd prefill``: run a prefill worker on vLLM, or on transformers where vLLM is absent."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from epd.common.flags import Flag, add_dataclass_arguments, add_flag, from_arguments, refused
from epd.common.ports import PREFILL_PORT
from epd.common.roles import Role
from epd.common.server import ServerOptions
from epd.common.server_cli import pin_to_cpus, serve_announced, server_options
from epd.common.serving import stop_signals
from epd.common.telemetry_cli import configure_from_args
from epd.server.engine.device import CPU, device_type, resolve_device
from epd.server.engine.engine_cli import (
    add_engine_arguments,
    check_engine_arguments,
    engine_options,
    transformers_options,
    vllm_installed,
)
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.transfer_cli import set_nixl_log_level
from epd.server.worker.worker_cli import add_media_worker_arguments, media_worker_fields

if TYPE_CHECKING:
    from epd.server.engine.base import Engine
    from epd.server.engine.transformers_engine import TransformersOptions
    from epd.server.engine.vllm_options import VllmOptions

DEFAULT_PORT = PREFILL_PORT
# NOTE: no PrefillConfig field: the cli starts the engine it names.
ENGINE = Flag(
    "vllm: vLLM's engine (KV hand-off, batching); transformers: the model's transformers code "
    "in-process (aggregated modes only, no vLLM needed); auto: vllm when installed",
    env="EPD_ENGINE",
    choices=("auto", "vllm", "transformers"),
)


def resolve_engine(name: str, hands_off_kv: bool) -> str:
    """``vllm`` or ``transformers`` for ``--engine name``; ValueError when it cannot serve."""
    has_vllm = vllm_installed()
    if name == "auto":
        name = "vllm" if has_vllm else "transformers"
    if name == "vllm" and not has_vllm:
        raise ValueError(
            "--engine vllm: vLLM is not installed (scripts/install.sh installs "
            "it; --engine transformers runs without it)"
        )
    if name == "transformers" and hands_off_kv:
        raise ValueError(
            "the transformers engine does not hand its KV cache to decode workers; "
            "use --engine vllm, or --mode prefill_decode / encode_prefill without "
            "--kv-transfer"
        )
    return name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Prefill flags (``PrefillConfig``'s fields declare them), then engine, worker, media,
    data-plane, server and telemetry flags."""
    add_dataclass_arguments(parser, PrefillConfig)
    add_flag(parser, "engine", ENGINE, default="auto", kind=str)
    add_engine_arguments(parser)
    add_media_worker_arguments(parser, PrefillConfig, "MODE", DEFAULT_PORT)


def prefill_config(args: argparse.Namespace) -> PrefillConfig:
    """The ``PrefillConfig`` of the flags (``--model`` resolved by the caller); ValueError names
    a value out of range."""
    return from_arguments(
        PrefillConfig,
        args,
        capacity=args.max_pending,
        hands_off_kv=args.kv_transfer or args.mode is Role.PREFILL,
        **media_worker_fields(args),
    )


def run(args: argparse.Namespace) -> int:
    """Start the engine, serve until SIGTERM/SIGINT, stop the engine."""
    try:
        check_engine_arguments(args)
        options = server_options(args)
        cpus = pin_to_cpus(args)
        config = prefill_config(args)
        args.engine = resolve_engine(args.engine, config.hands_off_kv)
        args.device = resolve_device(args.device)
        engine_settings = _engine_settings(args, config)
    except ValueError as e:
        return refused("prefill", e)
    configure_from_args("epd-prefill", args)
    set_nixl_log_level(args)
    threads = args.cpu_threads or (len(cpus) if cpus else 0)
    if args.engine == "transformers" and device_type(args.device) == CPU and threads:
        import torch

        torch.set_num_threads(threads)
    return asyncio.run(_serve(args, config, engine_settings, options))


def _engine_settings(
    args: argparse.Namespace, config: PrefillConfig
) -> VllmOptions | TransformersOptions:
    if args.engine == "transformers":
        return transformers_options(args, args.device)
    kv_role = "kv_producer" if config.hands_off_kv else None
    return engine_options(args, kv_role, args.device)


async def _serve(
    args: argparse.Namespace,
    config: PrefillConfig,
    engine_settings: VllmOptions | TransformersOptions,
    options: ServerOptions,
) -> int:
    with stop_signals() as stop:
        try:
            engine = await _start_engine(args, engine_settings)
        except ValueError as e:
            return refused("prefill", e)
        try:
            try:
                app = await build_prefill_server(config, engine, options)
            except ValueError as e:
                return refused("prefill", e)
            detail = f" ({config.mode.label}, {args.engine})"
            await serve_announced(
                "prefill", app.server, app.port, stop, host=options.host, detail=detail
            )
            app.worker.plane.close()
        finally:
            await engine.close()
    return 0


async def _start_engine(
    args: argparse.Namespace, settings: VllmOptions | TransformersOptions
) -> Engine:
    from epd.server.engine.transformers_engine import TransformersOptions

    if isinstance(settings, TransformersOptions):
        from epd.server.engine.transformers_engine import TransformersEngine

        return await TransformersEngine.start(args.model, model_id=args.model_id, options=settings)
    from epd.server.engine.vllm_engine import VllmEngine

    return await VllmEngine.start(args.model, model_id=args.model_id, options=settings)
