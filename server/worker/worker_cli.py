"""Registration flags of every worker's command line (encode, prefill, decode): its id, weight and
scheduler, each defaulting to the field of the same name of the worker's config dataclass; and
the flags and config fields of the workers that load media (encode, prefill)."""

from __future__ import annotations

import argparse
from typing import Any

from epd.common.flags import Flag, add_flag, default_of
from epd.common.server_cli import add_server_arguments
from epd.common.telemetry_cli import add_telemetry_arguments
from epd.server.media.media_cli import add_media_arguments, media_policy
from epd.server.transfer.transfer_cli import add_transfer_arguments, transfer_options

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


def worker_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields ``add_worker_arguments``' flags fill: worker_id, weight, scheduler."""
    return {"worker_id": args.worker_id, "weight": args.weight, "scheduler": args.scheduler}


def add_media_worker_arguments(
    parser: argparse.ArgumentParser, config: type, role: str, default_port: int
) -> None:
    """Registration (``add_worker_arguments``), media, data-plane, server and telemetry flags of
    a worker that loads media (encode, prefill)."""
    add_worker_arguments(parser, config, role)
    add_media_arguments(parser)
    add_transfer_arguments(parser)
    add_server_arguments(parser, default_port=default_port)
    add_telemetry_arguments(parser)


def media_worker_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields ``add_media_worker_arguments``' flags and ``--model`` (resolved by the
    caller) fill: ``worker_fields``, model_dir, media and transfer."""
    return {
        **worker_fields(args),
        "model_dir": args.model,
        "media": media_policy(args),
        "transfer": transfer_options(args),
    }
