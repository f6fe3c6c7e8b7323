"""serve_worker, how every worker starts: named before its first RPC (``--worker-id`` wins),
registered with the scheduler as its role, SERVING, draining through its worker's hooks, and
freeing what the worker holds once stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epd.common.channels import create_channel, wait_for_health
from epd.common.roles import Role
from epd.common.server import ServerOptions
from epd.scheduler.app import build_scheduler_server
from epd.scheduler.config import SchedulerConfig
from epd.server.worker.serve_worker import WorkerApp, WorkerSpec, serve_worker, worker_id
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding


class FakeWorker:
    """Drains when told, settles when ``settle`` is called; records its names and closes."""

    def __init__(self) -> None:
        self.is_draining = False
        self.settled = False
        self.names: list[tuple[str, str]] = []
        self.num_closed = 0

    async def stop_taking_work(self) -> None:
        self.is_draining = True

    def is_settled(self) -> bool:
        return self.settled

    def name(self, worker_id: str, endpoint: str) -> None:
        self.names.append((worker_id, endpoint))

    async def close(self) -> None:
        self.num_closed += 1


def create_spec(worker: FakeWorker, **changes: Any) -> WorkerSpec[FakeWorker]:
    fields: dict[str, Any] = {
        "role": Role.ENCODE,
        "worker": worker,
        "binding": encode_binding(ScriptedEncodeService()),
        "info": pb.WorkerInfo(device="cpu", weight=2.0, capacity=3, model="tiny"),
        "host_id": "node1",
        "load": lambda: pb.WorkerLoad(queue_depth=1),
        "drains": worker,
        "on_named": worker.name,
        "close": worker.close,
    }
    return WorkerSpec(**(fields | changes))


@pytest.fixture
async def scheduler() -> AsyncIterator[str]:
    server, port = await build_scheduler_server(config=SchedulerConfig(ttl_s=1.0))
    yield f"127.0.0.1:{port}"
    await server.drain_and_stop(0)


async def registered(scheduler: str, timeout_s: float = 5.0) -> list[pb.WorkerStatus]:
    async with create_channel(scheduler) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        async with asyncio.timeout(timeout_s):
            while True:
                reply = await stub.ListWorkers(pb.ListWorkersRequest())
                if reply.workers:
                    return list(reply.workers)
                await asyncio.sleep(0.02)


async def test_a_worker_is_named_registered_and_serving(scheduler: str) -> None:
    worker = FakeWorker()
    app = await serve_worker(create_spec(worker, scheduler=scheduler), ServerOptions())
    endpoint = f"127.0.0.1:{app.port}"
    assert app.info.id == worker_id(Role.ENCODE, "node1", app.port)
    assert worker.names == [(app.info.id, endpoint)]
    await wait_for_health(endpoint, timeout_s=2)
    [status] = await registered(scheduler)
    assert (status.info.id, status.info.endpoint) == (app.info.id, endpoint)
    assert status.info.role == pb.WORKER_ROLE_ENCODE and status.info.host_id == "node1"
    assert (status.info.device, status.info.capacity, status.info.model) == ("cpu", 3, "tiny")
    await app.stop()


async def test_an_explicit_worker_id_wins() -> None:
    worker = FakeWorker()
    app = await serve_worker(create_spec(worker, requested_id="enc-7"), ServerOptions())
    assert app.info.id == "enc-7" and worker.names[0][0] == "enc-7"
    await app.stop()


async def test_a_drain_stops_the_worker_taking_work_and_waits_until_it_settled() -> None:
    worker = FakeWorker()
    app: WorkerApp[FakeWorker] = await serve_worker(create_spec(worker), ServerOptions())
    stopping = asyncio.ensure_future(app.stop(grace=10.0))
    await asyncio.sleep(0.2)
    assert worker.is_draining and not stopping.done() and worker.num_closed == 0
    worker.settled = True
    await asyncio.wait_for(stopping, 2.0)
    assert worker.num_closed == 1, "closed once the server stopped"


async def test_a_worker_without_a_drain_stops_at_once_and_a_plain_close_is_called() -> None:
    worker = FakeWorker()
    closed: list[bool] = []
    spec = create_spec(worker, drains=None, on_named=None, close=lambda: closed.append(True))
    app = await serve_worker(spec, ServerOptions())
    await asyncio.wait_for(app.stop(grace=10.0), 2.0)
    assert closed == [True] and not worker.is_draining and worker.names == []
