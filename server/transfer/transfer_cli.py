"""Data-plane flags shared by the services' command lines, and the options they give."""

from __future__ import annotations

import argparse
import os

from epd.common.env import float_env, int_env
from epd.server.transfer.options import UCX_ERROR_HANDLING_MODES, NixlOptions, TransferOptions
from epd.server.transfer.shm_mappings import DEFAULT_MAX_BYTES

NIXL_LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")
# NOTE: NIXL logs every agent start at INFO, noise in servers and their engine processes.
DEFAULT_NIXL_LOG_LEVEL = "WARN"


def add_transfer_arguments(
    parser: argparse.ArgumentParser, *, shm: bool = True, nixl: bool = True
) -> None:
    """Add --host-id and, where the process reads shared memory (``shm``) or moves payloads
    over NIXL (``nixl``), their settings; each falls back to an EPD_* environment variable.
    ValueError naming the variable when one is malformed."""
    defaults = NixlOptions()
    group = parser.add_argument_group("data plane")
    group.add_argument(
        "--host-id",
        default=os.environ.get("EPD_HOST_ID", ""),
        help="this host's id: processes with equal ids hand payloads over in shared memory, "
        "others over NIXL or inline (env EPD_HOST_ID; default: host name and boot id, equal "
        "exactly for processes sharing /dev/shm; give containers with their own /dev/shm "
        "their own)",
    )
    if shm:
        group.add_argument(
            "--shm-mapped-bytes",
            type=int,
            default=int_env("EPD_SHM_MAPPED_BYTES", DEFAULT_MAX_BYTES, minimum=0),
            help="bytes of producers' shared-memory segments kept mapped for their next lease "
            f"(env EPD_SHM_MAPPED_BYTES; default {DEFAULT_MAX_BYTES}; 0 keeps none)",
        )
    if nixl:
        group.add_argument(
            "--nixl-ucx-error-handling",
            choices=UCX_ERROR_HANDLING_MODES,
            default=os.environ.get("EPD_NIXL_UCX_ERROR_HANDLING", defaults.ucx_error_handling),
            help="UCX error handling of the NIXL agent: none lets UCX use shared-memory "
            "transports on one host, peer detects failed peers instead "
            "(env EPD_NIXL_UCX_ERROR_HANDLING; default none)",
        )
        group.add_argument(
            "--nixl-poll-interval-s",
            type=float,
            default=float_env("EPD_NIXL_POLL_INTERVAL_S", defaults.poll_interval_s),
            help="seconds between polls of the NIXL agent for connections, notifications and "
            "READs it serves (env EPD_NIXL_POLL_INTERVAL_S; default "
            f"{defaults.poll_interval_s:g})",
        )
        group.add_argument(
            "--nixl-progress-thread",
            action="store_true",
            default=os.environ.get("EPD_NIXL_PROGRESS_THREAD") == "1",
            help="NIXL's own progress thread instead of polling; it spins a whole core "
            "(env EPD_NIXL_PROGRESS_THREAD=1; default off)",
        )
        add_nixl_log_level_argument(group)


def add_nixl_log_level_argument(parser: argparse._ActionsContainer) -> None:
    """Add --nixl-log-level, for a process that makes NIXL agents (ours, or vLLM's KV
    connector's in its engine processes); ``set_nixl_log_level`` applies it. ValueError naming
    the variable when its fallback is malformed."""
    default = os.environ.get("EPD_NIXL_LOG_LEVEL", "") or "auto"
    if default not in ("auto", *NIXL_LOG_LEVELS):
        raise ValueError(f"$EPD_NIXL_LOG_LEVEL must be auto or one of {NIXL_LOG_LEVELS}")
    parser.add_argument(
        "--nixl-log-level",
        choices=("auto", *NIXL_LOG_LEVELS),
        default=default,
        help="log level of the NIXL library in this process and the engine processes it starts "
        "(env EPD_NIXL_LOG_LEVEL; default auto: NIXL's own NIXL_LOG_LEVEL when set, else "
        f"{DEFAULT_NIXL_LOG_LEVEL})",
    )


def set_nixl_log_level(args: argparse.Namespace) -> None:
    """Hand ``--nixl-log-level`` to NIXL, which reads NIXL_LOG_LEVEL when it is first imported:
    call it before the server is built (child processes inherit it)."""
    if args.nixl_log_level != "auto":
        os.environ["NIXL_LOG_LEVEL"] = args.nixl_log_level
    else:
        os.environ.setdefault("NIXL_LOG_LEVEL", DEFAULT_NIXL_LOG_LEVEL)


def transfer_options(args: argparse.Namespace) -> TransferOptions:
    """Options from flags added by ``add_transfer_arguments``; ValueError when out of range."""
    nixl = NixlOptions()
    if "nixl_poll_interval_s" in vars(args):
        nixl = NixlOptions(
            ucx_error_handling=args.nixl_ucx_error_handling,
            poll_interval_s=args.nixl_poll_interval_s,
            progress_thread=args.nixl_progress_thread,
        )
    return TransferOptions(
        host_id=args.host_id,
        shm_mapped_bytes=getattr(args, "shm_mapped_bytes", DEFAULT_MAX_BYTES),
        nixl=nixl,
    )
