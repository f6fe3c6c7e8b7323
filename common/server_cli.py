"""Server flags shared by every service's command line, the ``ServerOptions`` they give, and the
line a started service prints before it serves."""

from __future__ import annotations

import argparse
import os

from epd.common.cpus import check_available, parse_cpu_list, pin_threads
from epd.common.flags import Flag, add_dataclass_arguments, add_flag, from_arguments
from epd.common.server import EpdServer, ServerOptions
from epd.common.serving import StopSignals, serve

# NOTE: no options field: the cli pins the process itself (pin_to_cpus).
CPUS = Flag(
    "CPUs this service and its engine's processes run on, as a list like 0-3,8",
    env="EPD_CPUS",
    default_help="default: every CPU it may use; a CPU engine's --cpu-threads and an encoder's "
    "--threads default to their count",
)


def add_server_arguments(parser: argparse.ArgumentParser, default_port: int = 0) -> None:
    """Add the server flags to ``parser`` (``ServerOptions``' fields declare them, but
    ``--cpus``); ValueError naming an EPD_* variable whose value is malformed. Each service has
    its own ``default_port``."""
    group = parser.add_argument_group("server")
    add_dataclass_arguments(group, ServerOptions, defaults={"port": default_port})
    add_flag(group, "cpus", CPUS, default=None, kind=str)


def server_options(args: argparse.Namespace) -> ServerOptions:
    """Options from flags added by ``add_server_arguments``; ValueError when inconsistent."""
    return from_arguments(ServerOptions, args)


def pin_to_cpus(args: argparse.Namespace) -> list[int] | None:
    """Pin this process (every thread it has, and so every thread and child it starts later)
    to ``--cpus``; returns them, or None when the flag is unset. ValueError when the list is
    malformed or names a CPU this process may not use."""
    if not args.cpus:
        return None
    cpus = parse_cpu_list(args.cpus)
    check_available(cpus)
    pin_threads(os.getpid(), cpus)
    return cpus


async def serve_announced(
    command: str, server: EpdServer, port: int, stop: StopSignals, *, host: str, detail: str = ""
) -> None:
    """Print ``epd COMMAND listening on HOST:PORT`` and ``detail`` (the line people and
    launchers wait for), then ``serve`` until a stop signal and drain."""
    print(f"epd {command} listening on {host}:{port}{detail}", flush=True)
    await serve(server, stop)
