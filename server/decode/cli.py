"""``epd decode``: run a decode worker on vLLM (KV pulled from prefill workers over NIXL)."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from epd.common.flags import refused
from epd.common.ports import DECODE_PORT
from epd.common.server import ServerOptions
from epd.common.server_cli import add_server_arguments, pin_to_cpus, serve_announced, server_options
from epd.common.serving import stop_signals
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.engine.device import resolve_device
from epd.server.engine.engine_cli import (
    add_engine_arguments,
    check_engine_arguments,
    engine_options,
    vllm_installed,
)
from epd.server.transfer.transfer_cli import (
    add_nixl_log_level_argument,
    add_transfer_arguments,
    set_nixl_log_level,
)
from epd.server.worker.worker_cli import add_worker_arguments, worker_fields

if TYPE_CHECKING:
    from epd.server.engine.vllm_options import VllmOptions

DEFAULT_PORT = DECODE_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine, worker, host id, NIXL log level, server and telemetry flags."""
    add_engine_arguments(parser)
    add_worker_arguments(parser, DecodeConfig, "decode")
    add_transfer_arguments(parser, shm=False, nixl=False)
    add_nixl_log_level_argument(parser)
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The ``DecodeConfig`` of the flags."""
    return DecodeConfig(capacity=args.max_pending, host_id=args.host_id, **worker_fields(args))


def run(args: argparse.Namespace) -> int:
    """Start the engine (KV consumer), serve until SIGTERM/SIGINT, stop the engine."""
    try:
        check_engine_arguments(args)
        if not vllm_installed():
            raise ValueError(
                "vLLM is not installed; decode workers pull KV caches with vLLM's "
                "NixlConnector (scripts/install.sh installs it)"
            )
        options = server_options(args)
        pin_to_cpus(args)
        args.device = resolve_device(args.device)
        engine_settings = engine_options(args, "kv_consumer", args.device)
    except ValueError as e:
        return refused("decode", e)
    config = decode_config(args)
    configure_from_args("epd-decode", args)
    set_nixl_log_level(args)
    return asyncio.run(_serve(args, config, engine_settings, options))


async def _serve(
    args: argparse.Namespace,
    config: DecodeConfig,
    engine_settings: VllmOptions,
    options: ServerOptions,
) -> int:
    from epd.server.engine.vllm_engine import VllmEngine

    with stop_signals() as stop:
        try:
            engine = await VllmEngine.start(
                args.model, model_id=args.model_id, options=engine_settings
            )
        except ValueError as e:
            return refused("decode", e)
        try:
            app = await build_decode_server(config, engine, options)
            await serve_announced("decode", app.server, app.port, stop, host=options.host)
        finally:
            await engine.close()
    return 0
