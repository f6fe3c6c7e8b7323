"""``epd up --encoders MIN:MAX``: encoders that follow the scheduler's signal on one host.

Every ``scale_interval_s`` the autoscaler reads ``GetEncoderDemand`` (the encoders each kind
needs to keep the encode wait under the scheduler's target) and gives each group's count to its
``GroupScaler``. Adding starts the group's lowest free slot and waits until it serves; draining
retires the group's highest running slot: SIGTERM, on which the encoder deregisters, refuses new
calls (the route sends their images to another encoder), finishes its streams and waits until
what it lent is released before it exits, so no request fails and nothing leaks. Each change is
reported in one line, counted (``epd_launcher_*`` metrics) and traced (one span from decision to
serving or drained, in the deployment's span file).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import grpc
from opentelemetry.trace import Span, Tracer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epd.common.channels import create_channel
from epd.common.metrics import LATENCY_BUCKETS_S
from epd.launch.encoders import EncoderGroup
from epd.launch.launcher import Child, Deployment, EncoderSlots
from epd.launch.scaling import GroupScaler, ScalingOptions
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)
# A retired encoder still running this long after SIGTERM is killed.
DRAIN_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ScalingGroup:
    """An ``EncoderGroup`` with the kind (device type) whose count it follows."""

    group: EncoderGroup
    kind: str


class ScalingMetrics:
    """The autoscaler's Prometheus metrics, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.changes = Counter(
            "epd_launcher_encoder_scalings",
            "Encoders added (direction up) or drained (down) by epd up --encoders MIN:MAX",
            ["device", "direction"],
            registry=registry,
        )
        self.running = Gauge(
            "epd_launcher_encoders", "Encoders running, by kind", ["device"], registry=registry
        )
        self.needed = Gauge(
            "epd_launcher_encoders_needed",
            "The scheduler's count of encoders needed, as last read, by kind",
            ["device"],
            registry=registry,
        )
        self.seconds = Histogram(
            "epd_launcher_encoder_scaling_duration_seconds",
            "From the decision to the added encoder serving (up) or the drained one gone (down)",
            ["direction"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )


class EncoderAutoscaler:
    """Adds and drains the encoders of ``groups`` as the scheduler at ``scheduler`` says."""

    def __init__(
        self,
        deployment: Deployment,
        slots: EncoderSlots,
        groups: list[ScalingGroup],
        options: ScalingOptions,
        *,
        metrics: ScalingMetrics,
        tracer: Tracer,
        report: Callable[[str], None] = print,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.deployment, self.slots, self.groups = deployment, slots, groups
        self.options, self.metrics, self.tracer = options, metrics, tracer
        self.report, self.on_change = report, on_change
        self.scalers = {
            g.kind: GroupScaler(
                g.group.minimum,
                g.group.maximum,
                options.scale_up_after_s,
                options.scale_down_after_s,
            )
            for g in groups
        }

    async def run(self, scheduler: str) -> NoReturn:
        """Follow the scheduler at ``scheduler`` (host:port) until cancelled."""
        async with create_channel(scheduler) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)
            while True:
                await asyncio.sleep(self.options.scale_interval_s)
                try:
                    reply = await stub.GetEncoderDemand(pb.GetEncoderDemandRequest(), timeout=5)
                except grpc.aio.AioRpcError as e:
                    logger.warning("autoscaler: no demand from the scheduler (%s)", e.code())
                    continue
                needed: dict[str, int] = {}
                for demand in reply.demands:
                    needed[demand.device] = needed.get(demand.device, 0) + demand.num_needed
                await self.step(needed)

    async def step(self, needed: dict[str, int], now: float | None = None) -> None:
        """Give each group's count to its scaler and act on what it decides."""
        for scaling in self.groups:
            count = needed.get(scaling.kind, 0)
            running = self.running(scaling.group)
            self.metrics.needed.labels(scaling.kind).set(count)
            self.metrics.running.labels(scaling.kind).set(len(running))
            now = time.monotonic() if now is None else now
            decision = self.scalers[scaling.kind].decide(now, len(running), count)
            if decision > 0:
                await self._add(scaling, running, count)
            elif decision < 0:
                await self._drain(scaling, running, count)

    def running(self, group: EncoderGroup) -> list[Child]:
        """The group's encoders in the deployment now, by slot."""
        names = {f"encode{slot}": slot for slot in group.slots}
        found = [c for c in self.deployment.children if c.name in names]
        return sorted(found, key=lambda child: names[child.name])

    async def _add(self, scaling: ScalingGroup, running: list[Child], needed: int) -> None:
        taken = {child.name for child in running}
        slot = next(s for s in scaling.group.slots if f"encode{s}" not in taken)
        start = time.monotonic()
        with self.tracer.start_as_current_span("autoscale.add_encoder") as span:
            _describe(span, scaling.kind, f"encode{slot}", len(running), needed)
            child = self.slots.start(slot)
            try:
                await self.deployment.wait_healthy(child, START_TIMEOUT_S)
            except RuntimeError as e:
                span.set_attribute("epd.error", str(e))
                self.report(f"epd up: encoder {child.name} did not start: {e}")
                self.deployment.retire(child)
                await self._until_retired(child)
                return
        self._record(scaling.kind, "up", start, f"added {child.name}", len(running), needed)

    async def _drain(self, scaling: ScalingGroup, running: list[Child], needed: int) -> None:
        child = running[-1]
        start = time.monotonic()
        with self.tracer.start_as_current_span("autoscale.drain_encoder") as span:
            _describe(span, scaling.kind, child.name, len(running), needed)
            self.deployment.retire(child)
            self.on_change()
            await self._until_retired(child)
        self._record(scaling.kind, "down", start, f"drained {child.name}", len(running), needed)

    async def _until_retired(self, child: Child) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not self.deployment.has_retired(child, kill=time.monotonic() > deadline):
            await asyncio.sleep(0.2)

    def _record(
        self, kind: str, direction: str, start: float, what: str, before: int, needed: int
    ) -> None:
        seconds = time.monotonic() - start
        after = before + (1 if direction == "up" else -1)
        self.metrics.changes.labels(kind, direction).inc()
        self.metrics.seconds.labels(direction).observe(seconds)
        self.metrics.running.labels(kind).set(after)
        self.report(
            f"epd up: autoscale {kind}: {what} in {seconds:.1f}s ({before} -> {after} "
            f"encoders; the scheduler counts {needed} needed)"
        )
        self.on_change()


def _describe(span: Span, kind: str, name: str, running: int, needed: int) -> None:
    span.set_attributes(
        {"epd.device": kind, "epd.encoder": name, "epd.running": running, "epd.needed": needed}
    )
