"""Registration flags of every worker's command line (encode, prefill, decode): its id, weight and
scheduler, each defaulting to the field of the same name of the worker's config dataclass."""

from __future__ import annotations

import argparse

from epd.common.flags import Flag, add_flag, default_of

SCHEDULER = Flag(
    "scheduler host:port to register with",
    env="EPD_SCHEDULER",
    default_help="default: none, serve direct calls only",
)
WEIGHT = Flag("share of work under weighted policies")


def add_worker_arguments(parser: argparse.ArgumentParser, config: type, role: str) -> None:
    """Add --worker-id, --weight and --scheduler; ``config`` (``EncodeConfig``,
    ``PrefillConfig``, ``DecodeConfig``) owns their defaults, ``role`` names the default id."""
    worker_id = Flag(
        "id in the scheduler's registry",
        env="EPD_WORKER_ID",
        default_help=f"default {role}-HOST_ID-PORT",
    )
    add_flag(parser, "worker_id", worker_id, default=default_of(config, "worker_id"), kind=str)
    add_flag(parser, "weight", WEIGHT, default=default_of(config, "weight"), kind=float)
    add_flag(parser, "scheduler", SCHEDULER, default=default_of(config, "scheduler"), kind=str)
