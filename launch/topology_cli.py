"""``epd up``'s topology flags: which topology, its encoders and their devices, the replicas of
its engine workers, the encoder policy; read into a ``Topology`` by ``topology_of``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from epd.launch.topology import TOPOLOGIES, Topology
from epd.scheduler.cli import add_policy_argument
from epd.scheduler.model import Policy
from epd.server.engine.device import CUDA, XPU, cuda_device_index, device_type, xpu_available


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """The topology flags of ``epd up``; ``Topology`` owns their defaults."""
    add = parser.add_argument
    defaults = Topology()
    add(
        "--topology",
        choices=sorted(TOPOLOGIES),
        default=defaults.name,
        help="; ".join(f"{k}: {v}" for k, v in TOPOLOGIES.items()) + f" (default {defaults.name})",
    )
    add(
        "--encoders",
        type=int,
        default=defaults.num_encoders,
        help="number of encoders for epd and e-pd, each on --encoder-devices' default "
        f"(default {defaults.num_encoders})",
    )
    add(
        "--encoder-devices",
        default="",
        metavar="LIST",
        help="the device of each encoder, in order, e.g. cuda,cuda,cpu (the number of encoders "
        "follows the list; several may share one GPU): auto, cpu, cuda, cuda:N, xpu or xpu:N "
        "(default: every encoder on auto, the accelerator where there is one, else CPU; "
        "dual-encoder: auto,cpu)",
    )
    add(
        "--prefill-workers",
        type=positive,
        default=defaults.num_prefill,
        metavar="N",
        help="replicas of the prefill-side engine worker (prefill for epd, encode+prefill for "
        "ep-d, prefill+decode for e-pd and dual-encoder, encode+prefill+decode for epd1): "
        "services prefill, prefill1.., worker ids prefill0.., sharing the accelerator; the "
        f"scheduler picks among them by cached prefix, then load (default {defaults.num_prefill})",
    )
    add(
        "--decode-workers",
        type=positive,
        default=defaults.num_decode,
        metavar="N",
        help="replicas of the decode worker of epd and ep-d: services decode, decode1.., worker "
        f"ids decode0.. (default {defaults.num_decode})",
    )
    add_policy_argument(parser, variable=None)
    add(
        "--policy",
        action=DeprecatedPolicy,
        choices=[policy.value for policy in Policy],
        dest="default_policy",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    add(
        "--split-ratio",
        default=defaults.split_ratio,
        help="ACCELERATOR:CPU shares for per_request, e.g. 8:1 (default: weights)",
    )
    add(
        "--encoder-threads",
        default="",
        help="CPU threads of each encoder in order, e.g. 2,1 makes the second "
        "encoder of dual-encoder the slower one (default: torch's default)",
    )


class DeprecatedPolicy(argparse.Action):
    """``--policy``, the old name of ``--default-policy`` (the scheduler's name for it): still
    taken, with a warning, and hidden from ``--help``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print("epd up: --policy is deprecated: use --default-policy", file=sys.stderr)
        setattr(namespace, self.dest, values)


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def topology_of(args: argparse.Namespace) -> Topology:
    """The ``Topology`` the flags describe (engine settings and CPUs aside); ValueError names
    what cannot be met, devices this machine lacks included."""
    topology = Topology(
        args.topology,
        args.encoders,
        args.default_policy,
        args.split_ratio,
        encoder_threads=parse_counts(args.encoder_threads),
        engine=args.engine,
        devices=parse_devices(args.encoder_devices, args.encoders),
        num_prefill=args.prefill_workers,
        num_decode=args.decode_workers,
    )
    check_encoder_devices(topology.encoder_devices)
    return topology


def parse_devices(text: str, num_encoders: int) -> tuple[str, ...]:
    """``"cuda,cuda,cpu"`` -> ("cuda", "cuda", "cpu"); ValueError when ``--encoders`` (if not
    its default of 1) says another count."""
    devices = tuple(part.strip() for part in text.split(",") if part.strip())
    if devices and num_encoders not in (1, len(devices)):
        raise ValueError(
            f"--encoders {num_encoders} but --encoder-devices names {len(devices)}: give one"
        )
    return devices


def check_encoder_devices(
    devices: list[str], cuda_index: Callable[[], int | None] = cuda_device_index
) -> None:
    """ValueError naming an encoder device this machine lacks (CUDA or XPU)."""
    for device in devices:
        kind = device_type(device)
        if kind == CUDA and cuda_index() is None:
            raise ValueError(
                f"--encoder-devices: {device} asked for, but CUDA is not available here"
            )
        if kind == XPU and not xpu_available():
            raise ValueError(
                f"--encoder-devices: {device} asked for, but XPU is not available here"
            )


def parse_counts(text: str) -> tuple[int, ...]:
    """``"2,1"`` -> (2, 1); ValueError names what is wrong."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--encoder-threads {text!r}: expected integers like 2,1") from None
