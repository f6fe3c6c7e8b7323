"""``epd encode``: run an encode server."""

from __future__ import annotations

import argparse
import asyncio

from epd.common.flags import Flag, add_dataclass_arguments, add_flag, from_arguments, refused
from epd.common.ports import ENCODE_PORT
from epd.common.server import ServerOptions
from epd.common.server_cli import pin_to_cpus, serve_announced, server_options
from epd.common.serving import stop_signals
from epd.common.telemetry_cli import configure_from_args
from epd.server.encode.app import build_encode_server
from epd.server.encode.config import EncodeConfig
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments
from epd.server.transfer.transfer_cli import set_nixl_log_level
from epd.server.worker.worker_cli import add_media_worker_arguments, media_worker_fields

DEFAULT_PORT = ENCODE_PORT
# NOTE: no EncodeConfig field: the cli sets torch's threads itself.
THREADS = Flag(
    "CPU threads of the vision tower; give CPU encoders that share a machine with engines fewer",
    env="EPD_ENCODER_THREADS",
    default_means="the --cpus count when given, else torch's default, one per core",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Encoder flags (``EncodeConfig``'s fields declare them), then worker, media, data-plane,
    server and telemetry flags."""
    add_model_arguments(
        parser,
        required=True,
        what="a checkpoint of a supported family; only its vision tower is loaded",
    )
    add_dataclass_arguments(parser, EncodeConfig)
    add_flag(parser, "threads", THREADS, default=0, kind=int)
    add_media_worker_arguments(parser, EncodeConfig, "encode", DEFAULT_PORT)


def encode_config(args: argparse.Namespace) -> EncodeConfig:
    """The ``EncodeConfig`` of the flags (``--model`` resolved by the caller); ValueError names
    a value out of range."""
    return from_arguments(EncodeConfig, args, **media_worker_fields(args))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; bad flags exit 2 with a message."""
    try:
        resolve_model_arguments(args)
        if args.threads < 0:
            raise ValueError("--threads must be 0 (the default) or more")
        config = encode_config(args)
        options = server_options(args)
        cpus = pin_to_cpus(args)
    except ValueError as e:
        return refused("encode", e)
    configure_from_args("epd-encode", args)
    set_nixl_log_level(args)
    threads = args.threads or (len(cpus) if cpus else 0)
    if threads:
        import torch

        torch.set_num_threads(threads)
    return asyncio.run(_serve(config, options))


async def _serve(config: EncodeConfig, options: ServerOptions) -> int:
    with stop_signals() as stop:
        try:
            app = await build_encode_server(config, options)
        except ValueError as e:
            return refused("encode", e)
        detail = f" as {app.info.id} (device {app.info.device})"
        await serve_announced(
            "encode", app.server, app.port, stop, host=options.host, detail=detail
        )
    await app.stop()  # NOTE: drained already: frees the worker's threads and payloads
    return 0
