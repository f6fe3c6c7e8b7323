"""``epd up``'s topology flags: which topology, its encoders and their devices, the replicas of
its engine workers, the encoder policy; read into a ``Topology`` by ``topology_of``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from epd.common.flags import add_dataclass_arguments, from_arguments
from epd.launch.topology import Topology
from epd.scheduler.model import Policy
from epd.server.engine.device import CUDA, XPU, cuda_device_index, device_type, xpu_available


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """The topology flags of ``epd up`` (``Topology``'s fields declare them) and the hidden
    ``--policy``, the old name of ``--default-policy``."""
    add_dataclass_arguments(parser, Topology)
    parser.add_argument(
        "--policy",
        action=DeprecatedPolicy,
        choices=[policy.value for policy in Policy],
        dest="default_policy",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
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


def topology_of(args: argparse.Namespace) -> Topology:
    """The ``Topology`` the flags describe (engine settings and CPUs aside); ValueError names
    what cannot be met, devices this machine lacks included."""
    devices = args.encoder_devices
    # NOTE: --encoders left at its default of 1 follows the device list; MIN:MAX applies to each.
    count = args.encoders
    if devices and not count.scales and count.minimum not in (1, len(devices)):
        raise ValueError(
            f"--encoders {args.encoders} but --encoder-devices names {len(devices)}: give one"
        )
    topology = from_arguments(Topology, args)
    check_encoder_devices(topology.encoder_devices)
    return topology


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
