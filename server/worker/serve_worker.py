"""How every worker (encode, prefill, decode) starts and stops: one ``serve_worker``.

A role's ``app.py`` builds what is its own (engine or tower, data plane, worker object, servicer,
metrics) and describes it in a ``WorkerSpec``; ``serve_worker`` does the rest, the same way for
all three: it binds the service, names the worker (``worker_id``) before its first RPC, sets up
the drain (deregister, stop taking work, hold until settled), registers with the scheduler
(heartbeating the worker's load), marks the server SERVING and returns a ``WorkerApp``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from epd.common.roles import Role
from epd.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.server.worker.registration import LoadFn, Resync, WorkerRegistration, start_registration
from epd.v1 import scheduler_service_pb2 as scheduler_pb

logger = logging.getLogger(__name__)

Close = Callable[[], Awaitable[None] | None]  # a coroutine function or a plain function
Named = Callable[[str, str], None]
W = TypeVar("W")


def worker_id(role: Role, host_id: str, port: int) -> str:
    """The id a worker registers under unless given one: ``ROLE-HOST_ID-PORT``
    (``prefill_decode-node1-50071``), unique per host and port."""
    return f"{role.label}-{host_id}-{port}"


class Drainable(Protocol):
    """A worker that drains on its own terms (it lent something a consumer still reads)."""

    async def stop_taking_work(self) -> None:
        """Refuse new calls (UNAVAILABLE, reason DRAINING); those in flight finish. Called once,
        when the drain starts."""

    def is_settled(self) -> bool:
        """Whether the server may stop now without failing anyone (polled while draining)."""


@dataclass
class WorkerSpec(Generic[W]):
    """What a role says about its worker; ``serve_worker`` does the rest.

    ``info``: the worker's own ``WorkerInfo`` fields (device, weight, capacity, model, ...);
    id, role, endpoint and host id are filled in. ``requested_id``: the id to register under
    (``--worker-id``; empty: ``worker_id(role, host_id, port)``). ``drains``: the worker's drain,
    if it has one. ``on_named``: told the worker's id and advertised endpoint before its first
    RPC. ``close``: frees what the worker holds once the server stopped (None: nothing).
    ``resync``: told when the scheduler may lack the deltas ``load`` reported
    (``WorkerRegistration``)."""

    role: Role
    worker: W
    binding: ServiceBinding
    info: scheduler_pb.WorkerInfo
    host_id: str
    load: LoadFn
    scheduler: str | None = None
    requested_id: str = ""
    registry: CollectorRegistry | None = None
    drains: Drainable | None = None
    heartbeat_interval_s: float | None = None
    on_named: Named | None = None
    close: Close | None = None
    resync: Resync | None = None


@dataclass
class WorkerApp(Generic[W]):
    """A running worker: its server and port, its worker object and its registration."""

    server: EpdServer
    port: int
    worker: W
    registration: WorkerRegistration
    close: Close | None = field(default=None, repr=False)

    @property
    def info(self) -> scheduler_pb.WorkerInfo:
        """What the worker registered (or would register) as: id, endpoint, device, ..."""
        return self.registration.info

    async def stop(self, grace: float | None = 0) -> None:
        """Drain and stop the server, then free what the worker holds (an engine passed in is
        the caller's to close). Idempotent once the drain is done."""
        await self.server.drain_and_stop(grace)
        if self.close is not None and (closing := self.close()) is not None:
            await closing


async def serve_worker(spec: WorkerSpec[W], options: ServerOptions) -> WorkerApp[W]:
    """Serve ``spec``'s worker: bind, name it, set up the drain, register, mark SERVING."""
    info = scheduler_pb.WorkerInfo()
    info.CopyFrom(spec.info)
    info.role = spec.role.value
    info.host_id = spec.host_id

    def name(port: int) -> None:
        info.id = spec.requested_id or worker_id(spec.role, spec.host_id, port)
        info.endpoint = options.advertised_endpoint(port, spec.scheduler)
        if spec.on_named is not None:
            spec.on_named(info.id, info.endpoint)

    server, port = await build_server([spec.binding], options, spec.registry, on_bound=name)
    registration = await start_registration(
        server,
        info,
        spec.load,
        spec.scheduler,
        options,
        interval_s=spec.heartbeat_interval_s,
        resync=spec.resync,
    )
    if spec.drains is not None:
        server.add_drain_callback(spec.drains.stop_taking_work)
        server.add_drain_hold(spec.drains.is_settled)
    await server.mark_serving()
    logger.info(
        "%s worker %s serving %s on %s (device %s)",
        spec.role.label,
        info.id,
        info.model,
        info.endpoint,
        info.device,
    )
    return WorkerApp(server, port, spec.worker, registration, spec.close)
