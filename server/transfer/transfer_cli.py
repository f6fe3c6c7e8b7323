"""Data-plane flags shared by the services' command lines, and the options they give."""

from __future__ import annotations

import argparse
import os

from epd.common.flags import Flag, add_dataclass_arguments, add_flag, from_arguments
from epd.server.transfer.options import NixlOptions, TransferOptions

NIXL_LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")
# NOTE: NIXL logs every agent start at INFO, noise in servers and their engine processes.
DEFAULT_NIXL_LOG_LEVEL = "WARN"
# NOTE: no options field: the cli hands it to NIXL through its own variable (set_nixl_log_level).
NIXL_LOG_LEVEL = Flag(
    "log level of the NIXL library in this process and the engine processes it starts",
    env="EPD_NIXL_LOG_LEVEL",
    choices=("auto", *NIXL_LOG_LEVELS),
    default_help=f"default auto: NIXL's own NIXL_LOG_LEVEL when set, else {DEFAULT_NIXL_LOG_LEVEL}",
)


def add_transfer_arguments(
    parser: argparse.ArgumentParser, *, shm: bool = True, nixl: bool = True
) -> None:
    """Add --host-id and, where the process reads shared memory (``shm``) or moves payloads
    over NIXL (``nixl``), their settings (``TransferOptions``' and ``NixlOptions``' fields
    declare them). ValueError naming an EPD_* variable whose value is malformed."""
    group = parser.add_argument_group("data plane")
    add_dataclass_arguments(group, TransferOptions, skip=() if shm else ("shm_mapped_bytes",))
    if nixl:
        add_dataclass_arguments(group, NixlOptions)
        add_nixl_log_level_argument(group)


def add_nixl_log_level_argument(parser: argparse._ActionsContainer) -> None:
    """Add --nixl-log-level, for a process that makes NIXL agents (ours, or vLLM's KV
    connector's in its engine processes); ``set_nixl_log_level`` applies it. ValueError naming
    the variable when its fallback is malformed."""
    add_flag(parser, "nixl_log_level", NIXL_LOG_LEVEL, default="auto", kind=str)


def set_nixl_log_level(args: argparse.Namespace) -> None:
    """Hand ``--nixl-log-level`` to NIXL, which reads NIXL_LOG_LEVEL when it is first imported:
    call it before the server is built (child processes inherit it)."""
    if args.nixl_log_level != "auto":
        os.environ["NIXL_LOG_LEVEL"] = args.nixl_log_level
    else:
        os.environ.setdefault("NIXL_LOG_LEVEL", DEFAULT_NIXL_LOG_LEVEL)


def transfer_options(args: argparse.Namespace) -> TransferOptions:
    """Options from flags added by ``add_transfer_arguments``; ValueError when out of range."""
    return from_arguments(TransferOptions, args, nixl=from_arguments(NixlOptions, args))
