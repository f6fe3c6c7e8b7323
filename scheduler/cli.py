"""``epd scheduler``: run the scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import logging

from epd.common.errors import InvalidArgument
from epd.common.flags import add_dataclass_arguments, from_arguments, refused
from epd.common.ports import SCHEDULER_PORT
from epd.common.server import ServerOptions
from epd.common.server_cli import add_server_arguments, pin_to_cpus, serve_announced, server_options
from epd.common.serving import stop_signals
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.scheduler.config import SchedulerConfig

DEFAULT_PORT = SCHEDULER_PORT
logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Scheduler flags (``SchedulerConfig``'s fields declare them), then the shared server and
    telemetry flags."""
    add_dataclass_arguments(parser, SchedulerConfig)
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The ``SchedulerConfig`` of the flags; ValueError names a value out of range."""
    return from_arguments(SchedulerConfig, args)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    try:
        config = scheduler_config(args)
        options = server_options(args)
        pin_to_cpus(args)
    except (InvalidArgument, ValueError) as e:
        return refused("scheduler", e)
    configure_from_args("epd-scheduler", args)
    return asyncio.run(_serve(options, config))


async def _serve(options: ServerOptions, config: SchedulerConfig) -> int:
    from epd.scheduler.app import build_scheduler_server

    with stop_signals() as stop:
        server, port = await build_scheduler_server(options, config)
        await serve_announced("scheduler", server, port, stop, host=options.host)
    return 0
