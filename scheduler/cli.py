"""``epd scheduler``: run the scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from epd.common.errors import InvalidArgument
from epd.common.options import field_default
from epd.common.ports import SCHEDULER_PORT
from epd.common.server import ServerOptions, serve, stop_signals
from epd.common.server_cli import add_server_arguments, pin_to_cpus, server_options
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.scheduler.core import SchedulerConfig
from epd.scheduler.model import Policy
from epd.scheduler.policies.encoders import parse_split_ratio

DEFAULT_PORT = SCHEDULER_PORT
logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Scheduler flags, then the shared server and telemetry flags."""
    env = os.environ.get
    config = SchedulerConfig()
    add_policy_argument(parser)
    parser.add_argument(
        "--split-ratio",
        default=env("EPD_SPLIT_RATIO"),
        help="ACCELERATOR:CPU shares for per_request (and adaptive's prior), "
        "e.g. 8:1 (env EPD_SPLIT_RATIO; default: the workers' weights)",
    )
    parser.add_argument(
        "--ttl-s",
        type=float,
        default=float(env("EPD_SCHEDULER_TTL_S", config.ttl_s)),
        help="a worker missing heartbeats this long is evicted "
        f"(env EPD_SCHEDULER_TTL_S; default {config.ttl_s:g})",
    )
    parser.add_argument(
        "--probe-after-s",
        type=float,
        default=float(env("EPD_SCHEDULER_PROBE_AFTER_S", config.probe_after_s)),
        help="adaptive sends one item to an idle encoder whose service time has had no fresh "
        f"sample this long (env EPD_SCHEDULER_PROBE_AFTER_S; default {config.probe_after_s:g})",
    )
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def add_policy_argument(
    parser: argparse.ArgumentParser, variable: str | None = "EPD_SCHEDULER_POLICY"
) -> None:
    """``--default-policy``: the encoder policy of requests that name none (``epd up`` hands
    it to its scheduler), falling back to ``variable`` when that names one, then to
    ``SchedulerConfig``'s."""
    policy = field_default(SchedulerConfig, "default_policy").value
    parser.add_argument(
        "--default-policy",
        choices=[p.value for p in Policy],
        default=(os.environ.get(variable) if variable else None) or policy,
        help="encoder assignment policy when a request names none "
        f"({f'env {variable}; ' if variable else ''}default {policy})",
    )


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The ``SchedulerConfig`` of the flags; ValueError (or InvalidArgument for the split
    ratio) names a value out of range."""
    ratio = parse_split_ratio(args.split_ratio) if args.split_ratio else None
    return SchedulerConfig(
        default_policy=Policy(args.default_policy),
        split_ratio=ratio,
        ttl_s=args.ttl_s,
        probe_after_s=args.probe_after_s,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    try:
        config = scheduler_config(args)
        options = server_options(args)
        pin_to_cpus(args)
    except (InvalidArgument, ValueError) as e:
        print(f"epd scheduler: {e}", file=sys.stderr)
        return 2
    configure_from_args("epd-scheduler", args)
    return asyncio.run(_serve(options, config))


async def _serve(options: ServerOptions, config: SchedulerConfig) -> int:
    from epd.scheduler.app import build_scheduler_server

    with stop_signals() as stop:
        server, port = await build_scheduler_server(options, config)
        print(f"epd scheduler listening on {options.host}:{port}", flush=True)
        await serve(server, stop)
    return 0
