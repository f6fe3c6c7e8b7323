"""Registration flags of every worker's command line (encode, prefill, decode): its id, weight and
scheduler, each defaulting to the field of the same name of the worker's config dataclass."""

from __future__ import annotations

import argparse
import os

from epd.common.options import field_default


def add_worker_arguments(parser: argparse.ArgumentParser, config: type, role: str) -> None:
    """Add --worker-id, --weight and --scheduler; ``config`` (``EncodeConfig``,
    ``PrefillConfig``, ``DecodeConfig``) owns their defaults, ``role`` names the default id."""
    env = os.environ.get
    weight = field_default(config, "weight")
    parser.add_argument(
        "--worker-id",
        default=env("EPD_WORKER_ID", field_default(config, "worker_id")),
        help=f"id in the scheduler's registry (env EPD_WORKER_ID; default {role}-HOST_ID-PORT)",
    )
    parser.add_argument(
        "--weight",
        type=float,
        default=weight,
        help=f"share of work under weighted policies (default {weight:g})",
    )
    parser.add_argument(
        "--scheduler",
        default=env("EPD_SCHEDULER", field_default(config, "scheduler")),
        help="scheduler host:port to register with (env EPD_SCHEDULER; default: none, serve "
        "direct calls only)",
    )
