"""The worker side of the scheduler's registry: register, heartbeat, re-register, deregister.

Every worker (encode, prefill, decode) runs one ``WorkerRegistration``. It never raises into
the worker: while the scheduler is absent it retries with backoff, and the worker keeps serving
requests sent to it directly. A heartbeat answered NOT_FOUND (lease expired, or the scheduler
restarted and lost its soft state) triggers an immediate re-registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from epd.common.channels import DEFAULT_KEEPALIVE_S, create_channel
from epd.common.server import EpdServer, ServerOptions
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

LoadFn = Callable[[], pb.WorkerLoad]
Resync = Callable[[], None]
RPC_TIMEOUT_S = 3.0
MIN_INTERVAL_S = 0.05
# Codes a retry cannot fix without someone changing the worker's flags: logged as errors.
CONFIG_ERRORS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)


class WorkerRegistration:
    """Keeps one worker registered with the scheduler at ``scheduler_endpoint`` (None: no-op).

    ``load_fn`` is called before each heartbeat, on the event loop; it must be quick. Heartbeats
    go every ``interval_s`` (default: a third of the TTL the scheduler grants). Errors of any
    kind (scheduler down, ALREADY_EXISTS while a predecessor's lease runs out, ``load_fn``
    raising) are logged and retried with exponential backoff from ``retry_initial_s`` to
    ``retry_max_s``; nothing is raised into the worker. ``resync`` is called after each
    registration and each heartbeat that failed: the scheduler may lack what the worker
    reported as deltas, so its next load should carry its whole state.
    """

    def __init__(
        self,
        scheduler_endpoint: str | None,
        info: pb.WorkerInfo,
        load_fn: LoadFn,
        *,
        interval_s: float | None = None,
        auth_token: str | None = None,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        retry_initial_s: float = 0.2,
        retry_max_s: float = 5.0,
        resync: Resync | None = None,
    ) -> None:
        self.scheduler_endpoint = scheduler_endpoint
        self._resync = resync or (lambda: None)
        self.info = info
        self._load_fn = load_fn
        self._interval_s = interval_s
        self._auth_token = auth_token
        self._keepalive_s = keepalive_s
        self._retry = (retry_initial_s, retry_max_s)
        self._lease_id: str | None = None
        self._ttl_s = 10.0
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None

    @property
    def is_registered(self) -> bool:
        """True while the worker holds a lease the scheduler last confirmed."""
        return self._lease_id is not None

    async def start(self) -> None:
        """Start registering and heartbeating in the background (returns at once)."""
        if self.scheduler_endpoint is None or self._task is not None:
            return
        self._channel = create_channel(
            self.scheduler_endpoint, auth_token=self._auth_token, keepalive_s=self._keepalive_s
        )
        self._task = asyncio.create_task(self._run(pb_grpc.SchedulerServiceStub(self._channel)))

    async def stop(self, deregister: bool = True) -> None:
        """Stop heartbeating and, with ``deregister``, leave the registry. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if deregister and self._lease_id and self._channel is not None:
            stub = pb_grpc.SchedulerServiceStub(self._channel)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
                await stub.Deregister(
                    pb.DeregisterRequest(lease_id=self._lease_id), timeout=RPC_TIMEOUT_S
                )
        self._lease_id = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _run(self, stub: pb_grpc.SchedulerServiceStub) -> None:
        backoff = self._retry[0]
        while True:
            try:
                await (self._heartbeat_or_resync(stub) if self._lease_id else self._register(stub))
                backoff = self._retry[0]
                await asyncio.sleep(max(MIN_INTERVAL_S, self._interval_s or self._ttl_s / 3))
                continue
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    logger.info("scheduler forgot lease %s; registering again", self._lease_id)
                    self._lease_id = None
                    continue
                level = logging.ERROR if e.code() in CONFIG_ERRORS else logging.WARNING
                logger.log(
                    level,
                    "scheduler %s: %s %s; retrying in %.1fs",
                    self.scheduler_endpoint,
                    e.code().name,
                    e.details(),
                    backoff,
                )
            except Exception:  # NOTE: never let the loop die: the worker must stay registered
                logger.exception(
                    "registration with %s failed; retrying in %.1fs",
                    self.scheduler_endpoint,
                    backoff,
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._retry[1])

    async def _register(self, stub: pb_grpc.SchedulerServiceStub) -> None:
        reply = await stub.RegisterWorker(
            pb.RegisterWorkerRequest(worker=self.info), timeout=RPC_TIMEOUT_S
        )
        self._lease_id, self._ttl_s = reply.lease_id, reply.ttl_ms / 1000
        self._resync()
        logger.info("registered %s with scheduler %s", self.info.id, self.scheduler_endpoint)

    async def _heartbeat_or_resync(self, stub: pb_grpc.SchedulerServiceStub) -> None:
        try:
            await self._heartbeat(stub)
        except BaseException:
            self._resync()
            raise

    async def _heartbeat(self, stub: pb_grpc.SchedulerServiceStub) -> None:
        request = pb.HeartbeatRequest(lease_id=self._lease_id, load=self._load_fn())
        reply = await stub.Heartbeat(request, timeout=RPC_TIMEOUT_S)
        self._ttl_s = reply.ttl_ms / 1000


async def start_registration(
    server: EpdServer,
    info: pb.WorkerInfo,
    load_fn: LoadFn,
    scheduler_endpoint: str | None,
    options: ServerOptions,
    *,
    interval_s: float | None = None,
    resync: Resync | None = None,
) -> WorkerRegistration:
    """Start keeping ``server``'s worker ``info`` registered (``WorkerRegistration`` with the
    server's token and keepalive, ``resync`` as there), leaving the registry first when the
    server drains. The caller marks the server SERVING once the rest of its drain is set up."""
    registration = WorkerRegistration(
        scheduler_endpoint,
        info,
        load_fn,
        interval_s=interval_s,
        auth_token=options.auth_token,
        keepalive_s=options.keepalive_s,
        resync=resync,
    )
    server.add_drain_callback(registration.stop)
    await registration.start()
    return registration
