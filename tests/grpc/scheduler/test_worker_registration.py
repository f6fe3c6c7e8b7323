"""WorkerRegistration against an in-process scheduler: short leases, failing load functions,
a predecessor still holding the id. (Restart and absent-scheduler cases are in
test_scheduler_service.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from epd.common.channels import create_channel
from epd.common.server import ServerOptions, build_server
from epd.scheduler.app import build_scheduler_server
from epd.scheduler.config import SchedulerConfig
from epd.server.worker.registration import WorkerRegistration, start_registration
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

TTL_S = 1.0  # NOTE: generous: the suite shares two busy cores


def info(port: int = 7000) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        id="enc", role=pb.WORKER_ROLE_ENCODE, endpoint=f"127.0.0.1:{port}", weight=1.0, model="m"
    )


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    server, port = await build_scheduler_server(config=SchedulerConfig(ttl_s=TTL_S))
    yield f"127.0.0.1:{port}"
    await server.drain_and_stop(0)


async def list_workers(endpoint: str) -> list[pb.WorkerStatus]:
    async with create_channel(endpoint) as channel:
        reply = await pb_grpc.SchedulerServiceStub(channel).ListWorkers(pb.ListWorkersRequest())
        return list(reply.workers)


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_started_registration_leaves_the_registry_when_its_server_drains(
    endpoint: str,
) -> None:
    server, port = await build_server([], ServerOptions())
    registration = await start_registration(
        server, info(port), pb.WorkerLoad, endpoint, ServerOptions(), interval_s=0.05
    )

    async def registered() -> bool:
        return registration.is_registered and len(await list_workers(endpoint)) == 1

    await wait_until(registered)
    await server.drain_and_stop(0)
    assert not registration.is_registered
    assert await list_workers(endpoint) == []


async def test_heartbeats_at_a_third_of_the_ttl_keep_the_lease(endpoint: str) -> None:
    resyncs: list[int] = []  # NOTE: one per registration and per failed heartbeat
    registration = WorkerRegistration(
        endpoint, info(), pb.WorkerLoad, resync=lambda: resyncs.append(1)
    )
    await registration.start()

    async def registered() -> bool:
        return registration.is_registered

    await wait_until(registered)
    await asyncio.sleep(2.5 * TTL_S)
    (worker,) = await list_workers(endpoint)
    assert worker.heartbeat_age_ms < TTL_S * 1000
    assert len(resyncs) == 1  # registered once, never evicted, no heartbeat lost
    await registration.stop()
    assert await list_workers(endpoint) == []


async def test_a_failing_load_function_does_not_stop_heartbeats(endpoint: str) -> None:
    calls = []

    def load() -> pb.WorkerLoad:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("load probe broke")
        return pb.WorkerLoad(queue_depth=7)

    registration = WorkerRegistration(endpoint, info(), load, interval_s=0.05, retry_initial_s=0.01)

    async def reports_load() -> bool:
        return [w.load.queue_depth for w in await list_workers(endpoint)] == [7]

    await registration.start()
    await wait_until(reports_load)
    assert len(calls) >= 3
    await registration.stop()


async def test_waits_until_a_predecessor_at_another_endpoint_expires(endpoint: str) -> None:
    async with create_channel(endpoint) as channel:
        await pb_grpc.SchedulerServiceStub(channel).RegisterWorker(
            pb.RegisterWorkerRequest(worker=info(7001))
        )  # then goes silent
    registrations: list[int] = []  # NOTE: resync follows each registration
    registration = WorkerRegistration(
        endpoint,
        info(7002),
        pb.WorkerLoad,
        interval_s=0.05,
        retry_initial_s=0.05,
        retry_max_s=0.1,
        resync=lambda: registrations.append(1),
    )
    await registration.start()
    await asyncio.sleep(0.1)
    assert not registration.is_registered  # ALREADY_EXISTS while the old lease runs

    async def replaced() -> bool:
        return [w.info.endpoint for w in await list_workers(endpoint)] == ["127.0.0.1:7002"]

    await wait_until(replaced)
    assert registration.is_registered and len(registrations) == 1
    await registration.stop()


async def test_resync_follows_each_registration_and_each_failed_heartbeat(endpoint: str) -> None:
    resyncs: list[int] = []
    num_loads = 0

    def load() -> pb.WorkerLoad:
        nonlocal num_loads
        num_loads += 1
        if num_loads == 2:
            raise RuntimeError("a load that fails once")  # NOTE: its deltas never left
        return pb.WorkerLoad()

    registration = WorkerRegistration(
        endpoint,
        info(),
        load,
        interval_s=0.05,
        retry_initial_s=0.05,
        resync=lambda: resyncs.append(num_loads),
    )
    await registration.start()

    async def after_the_failure() -> bool:
        return num_loads >= 4

    await wait_until(after_the_failure)
    await registration.stop()
    assert resyncs[:2] == [0, 2]  # registered before any load; the failed heartbeat's
