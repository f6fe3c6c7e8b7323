"""``epd up``'s autoscaling flags and their wiring: the scaling windows, the scheduler's signal
settings it passes on, each group's kind, the autoscaler's metrics port and span file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import NoReturn

from epd.common.flags import add_dataclass_arguments, add_passed_on_arguments, from_arguments
from epd.common.metrics import new_registry, start_metrics_server
from epd.common.telemetry import add_exporter, new_provider
from epd.launch.autoscaler import EncoderAutoscaler, ScalingGroup, ScalingMetrics
from epd.launch.encoders import AUTO_DEVICE
from epd.launch.launcher import Deployment
from epd.launch.ports import LAUNCHER_METRICS_OFFSET
from epd.launch.public_entry import LOOPBACK
from epd.launch.scaling import ScalingOptions
from epd.launch.topology import Topology
from epd.scheduler.config import SchedulerConfig
from epd.server.engine.device import CPU, CUDA, XPU, cuda_device_index, device_type, xpu_available

# The scheduler's settings of the signal, which epd up passes on when given.
SIGNAL_FLAGS = ("encode_wait_target_s", "demand_smoothing_s")


def add_scaling_arguments(parser: argparse.ArgumentParser) -> None:
    """``ScalingOptions``' flags and the scheduler's signal settings, passed on when given."""
    add_dataclass_arguments(parser, ScalingOptions)
    add_passed_on_arguments(parser, SchedulerConfig, dict.fromkeys(SIGNAL_FLAGS))


def scaling_options(args: argparse.Namespace) -> ScalingOptions:
    """The scaling windows of the flags; ValueError when out of range."""
    return from_arguments(ScalingOptions, args)


def scheduler_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The signal settings given to epd up, as the scheduler's flags."""
    flags: list[str] = []
    for name in SIGNAL_FLAGS:
        if (value := getattr(args, name)) is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return tuple(flags)


def encoder_kind(device: str, accelerator: str | None) -> str:
    """The kind (device type) an encoder on ``device`` registers: ``auto`` is the machine's
    ``accelerator`` where it has one, else the CPU."""
    if device == AUTO_DEVICE:
        return accelerator or CPU
    return device_type(device)


def scaling_groups(topology: Topology, accelerator: str | None = None) -> list[ScalingGroup]:
    """Each group with its kind; ValueError when two groups would follow one kind's count."""
    if accelerator is None:
        accelerator = CUDA if cuda_device_index() is not None else XPU if xpu_available() else None
    groups = [ScalingGroup(g, encoder_kind(g.device, accelerator)) for g in topology.encoder_groups]
    kinds = [g.kind for g in groups]
    if topology.scales_encoders and len(set(kinds)) < len(kinds):
        raise ValueError(
            f"--encoders {topology.num_encoders} scales each kind of encoder on its own count: "
            f"the encoder devices ({', '.join(g.group.device for g in groups)}) name one kind "
            "twice; give each once"
        )
    return groups


async def autoscale(
    args: argparse.Namespace,
    deployment: Deployment,
    scheduler: str,
    report: Callable[[str], None],
    on_change: Callable[[], None],
) -> NoReturn:
    """Run the autoscaler of ``args.planned_topology`` against ``scheduler`` until cancelled;
    with metrics, serve its own on loopback first (``args.launcher_metrics_url``)."""
    registry = new_registry()
    metrics = ScalingMetrics(registry)
    provider = new_provider("epd-up")
    span_file: Path = args.span_file
    add_exporter(provider, f"json:{span_file}", args.trace_max_mb << 20)
    assert deployment.encoders is not None, "start_topology started no encoders"
    autoscaler = EncoderAutoscaler(
        deployment,
        deployment.encoders,
        scaling_groups(args.planned_topology),
        args.scaling,
        metrics=metrics,
        tracer=provider.get_tracer(__name__),
        report=report,
        on_change=on_change,
    )
    async with AsyncExitStack() as stack:
        stack.callback(provider.shutdown)
        if args.metrics:
            server = start_metrics_server(
                registry, LOOPBACK, deployment.port(LAUNCHER_METRICS_OFFSET)
            )
            stack.callback(server.close)
            args.launcher_metrics_url = f"http://{LOOPBACK}:{server.port}/metrics"
            on_change()
        await autoscaler.run(scheduler)
