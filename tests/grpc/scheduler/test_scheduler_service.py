"""SchedulerService in-process over gRPC, and WorkerRegistration against it."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from epd.common.channels import create_channel
from epd.common.server import ServerOptions
from epd.common.status import from_rpc_error
from epd.scheduler.app import build_scheduler_server
from epd.scheduler.config import SchedulerConfig
from epd.server.worker.registration import WorkerRegistration
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc


def info(
    worker_id: str,
    role: int = pb.WORKER_ROLE_ENCODE,
    port: int = 7000,
    device: str = "cpu",
    **fields: object,
) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        id=worker_id,
        role=role,
        endpoint=f"127.0.0.1:{port}",
        device=device,
        weight=fields.pop("weight", 1.0),
        model="m",
        **fields,
    )  # type: ignore[arg-type]


@pytest.fixture
async def scheduler():
    server, port = await build_scheduler_server(config=SchedulerConfig(ttl_s=30))
    channel = create_channel(f"127.0.0.1:{port}")
    yield pb_grpc.SchedulerServiceStub(channel), port
    await channel.close()
    await server.drain_and_stop(0)


async def fails_with(call, code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == code
    assert from_rpc_error(caught.value).reason == reason
    status = rpc_status.from_call(caught.value)  # type: ignore[arg-type]
    assert status is not None and status.code == code.value[0]
    (detail,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info) and info.reason == reason


async def test_register_heartbeat_list_deregister(scheduler) -> None:
    stub, _ = scheduler
    reply = await stub.RegisterWorker(pb.RegisterWorkerRequest(worker=info("e1")))
    assert reply.ttl_ms == 30_000
    await stub.Heartbeat(
        pb.HeartbeatRequest(
            lease_id=reply.lease_id,
            load=pb.WorkerLoad(queue_depth=3, item_latency_ms=12.5, batches_finished=4),
        )
    )
    listing = await stub.ListWorkers(pb.ListWorkersRequest(role=pb.WORKER_ROLE_ENCODE))
    (status,) = listing.workers
    assert status.info.id == "e1" and status.load.queue_depth == 3
    assert status.load.batches_finished == 4
    assert status.state == pb.WORKER_STATE_LIVE
    await stub.Deregister(pb.DeregisterRequest(lease_id=reply.lease_id))
    assert not (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    await fails_with(
        stub.Heartbeat(pb.HeartbeatRequest(lease_id=reply.lease_id)),
        grpc.StatusCode.NOT_FOUND,
        "LEASE_NOT_FOUND",
    )


@pytest.mark.parametrize(
    "worker, code, reason",
    [
        (info("", port=7001), grpc.StatusCode.INVALID_ARGUMENT, "BAD_WORKER_ID"),
        (info("w", weight=0.0), grpc.StatusCode.INVALID_ARGUMENT, "BAD_WEIGHT"),
        (info("w", weight=-1.0), grpc.StatusCode.INVALID_ARGUMENT, "BAD_WEIGHT"),
        (info("w", role=pb.WORKER_ROLE_UNSPECIFIED), grpc.StatusCode.INVALID_ARGUMENT, "BAD_ROLE"),
        (
            pb.WorkerInfo(id="w", role=1, endpoint="nowhere", model="m", weight=1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "BAD_ENDPOINT",
        ),
    ],
)
async def test_bad_registrations(scheduler, worker, code, reason) -> None:
    stub, _ = scheduler
    await fails_with(stub.RegisterWorker(pb.RegisterWorkerRequest(worker=worker)), code, reason)


async def test_duplicate_live_id_is_already_exists(scheduler) -> None:
    stub, _ = scheduler
    await stub.RegisterWorker(pb.RegisterWorkerRequest(worker=info("e1", port=7001)))
    await fails_with(
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker=info("e1", port=7002))),
        grpc.StatusCode.ALREADY_EXISTS,
        "DUPLICATE_WORKER_ID",
    )


async def test_assign_without_encoders_is_unavailable(scheduler) -> None:
    stub, _ = scheduler
    request = pb.AssignEncodersRequest(items=[pb.EncodeItem(mm_hash="a")])
    await fails_with(stub.AssignEncoders(request), grpc.StatusCode.UNAVAILABLE, "NO_ENCODER")
    await fails_with(
        stub.AssignEncoders(pb.AssignEncodersRequest()),
        grpc.StatusCode.INVALID_ARGUMENT,
        "NO_ITEMS",
    )


async def test_bad_requests_name_what_is_wrong(scheduler) -> None:
    stub, _ = scheduler
    for worker_id, port, model in (("a", 7001, "m"), ("b", 7002, "other")):
        worker = info(worker_id, port=port)
        worker.model = model
        await stub.RegisterWorker(pb.RegisterWorkerRequest(worker=worker))
    items = [pb.EncodeItem(mm_hash="x")]
    await fails_with(
        stub.AssignEncoders(pb.AssignEncodersRequest(items=items)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "MODEL_REQUIRED",
    )
    await fails_with(
        stub.AssignEncoders(pb.AssignEncodersRequest(model="m", items=items, policy=99)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "BAD_POLICY",
    )  # type: ignore[arg-type]
    await fails_with(
        stub.ChoosePrefill(pb.ChoosePrefillRequest(model="m", roles=[42])),  # type: ignore[list-item]
        grpc.StatusCode.INVALID_ARGUMENT,
        "BAD_ROLE",
    )
    await fails_with(
        stub.Heartbeat(pb.HeartbeatRequest()), grpc.StatusCode.NOT_FOUND, "LEASE_NOT_FOUND"
    )
    await stub.CompleteEncoding(pb.CompleteEncodingRequest(assignment_id="unknown"))
    await stub.Deregister(pb.DeregisterRequest(lease_id="unknown"))


async def test_deregistered_encoder_drains_then_leaves(scheduler) -> None:
    stub, _ = scheduler
    leases = {}
    for worker_id, port in (("a", 7001), ("b", 7002)):
        reply = await stub.RegisterWorker(
            pb.RegisterWorkerRequest(worker=info(worker_id, port=port))
        )
        leases[worker_id] = reply.lease_id
    assigned = await stub.AssignEncoders(
        pb.AssignEncodersRequest(
            items=[pb.EncodeItem(mm_hash="x")], policy=pb.ENCODER_POLICY_PER_IMAGE
        )
    )
    busy = assigned.assignments[0].worker_id
    await stub.Deregister(pb.DeregisterRequest(lease_id=leases[busy]))
    states = {w.info.id: w.state for w in (await stub.ListWorkers(pb.ListWorkersRequest())).workers}
    assert states[busy] == pb.WORKER_STATE_DRAINING and len(states) == 2
    again = await stub.AssignEncoders(pb.AssignEncodersRequest(items=[pb.EncodeItem()] * 3))
    assert {a.worker_id for a in again.assignments} == {"b" if busy == "a" else "a"}
    await stub.CompleteEncoding(pb.CompleteEncodingRequest(assignment_id=assigned.assignment_id))
    listing = await stub.ListWorkers(pb.ListWorkersRequest())
    assert [w.info.id for w in listing.workers] == ["b" if busy == "a" else "a"]


async def test_concurrent_assignments_follow_the_policy(scheduler) -> None:
    stub, _ = scheduler
    for worker_id, port in (("a", 7001), ("b", 7002)):
        await stub.RegisterWorker(pb.RegisterWorkerRequest(worker=info(worker_id, port=port)))
    # NOTE: items without a hash: concurrent requests for one hash join its first encoding
    request = pb.AssignEncodersRequest(
        items=[pb.EncodeItem(), pb.EncodeItem()], policy=pb.ENCODER_POLICY_PER_IMAGE
    )
    replies = await asyncio.gather(*(stub.AssignEncoders(request) for _ in range(50)))
    chosen = [a.worker_id for reply in replies for a in reply.assignments]
    assert chosen.count("a") == chosen.count("b") == 50
    assert all(r.policy == pb.ENCODER_POLICY_PER_IMAGE for r in replies)
    assert replies[0].assignments[0].endpoint in ("127.0.0.1:7001", "127.0.0.1:7002")
    await asyncio.gather(
        *(
            stub.CompleteEncoding(
                pb.CompleteEncodingRequest(
                    assignment_id=r.assignment_id,
                    outcomes=[pb.ItemOutcome(item_index=0, latency_ms=5)],
                )
            )
            for r in replies
        )
    )
    listing = await stub.ListWorkers(pb.ListWorkersRequest())
    assert [w.num_assigned_in_flight for w in listing.workers] == [0, 0]


async def test_choose_prefill_routes_shared_prefixes_together(scheduler) -> None:
    stub, _ = scheduler
    for worker_id, port in (("p1", 7101), ("p2", 7102)):
        await stub.RegisterWorker(
            pb.RegisterWorkerRequest(
                worker=info(worker_id, role=pb.WORKER_ROLE_PREFILL_DECODE, port=port)
            )
        )
    first = await stub.ChoosePrefill(pb.ChoosePrefillRequest(block_hashes=[1, 2, 3]))
    again = await stub.ChoosePrefill(pb.ChoosePrefillRequest(block_hashes=[1, 2, 3, 4]))
    assert again.worker.id == first.worker.id and again.num_cached_blocks == 3
    other = await stub.ChoosePrefill(
        pb.ChoosePrefillRequest(block_hashes=[1, 2], exclude_worker_ids=[first.worker.id])
    )
    assert other.worker.id != first.worker.id
    await fails_with(
        stub.ChooseDecode(pb.ChooseDecodeRequest()), grpc.StatusCode.UNAVAILABLE, "NO_DECODE_WORKER"
    )


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_registration_survives_a_scheduler_restart() -> None:
    server, port = await build_scheduler_server(config=SchedulerConfig(ttl_s=30))
    endpoint = f"127.0.0.1:{port}"
    load = pb.WorkerLoad(queue_depth=2)
    registration = WorkerRegistration(endpoint, info("enc"), lambda: load, interval_s=0.05)
    await registration.start()

    async def listed() -> bool:
        async with create_channel(endpoint) as channel:
            reply = await pb_grpc.SchedulerServiceStub(channel).ListWorkers(pb.ListWorkersRequest())
            return [w.load.queue_depth for w in reply.workers] == [2]

    await wait_until(listed)
    await server.drain_and_stop(0)
    server, _ = await build_scheduler_server(ServerOptions(port=port), SchedulerConfig(ttl_s=30))
    await wait_until(listed)  # NOTE: the new scheduler knows no lease: the worker registered again
    await registration.stop()

    async def empty() -> bool:
        async with create_channel(endpoint) as channel:
            reply = await pb_grpc.SchedulerServiceStub(channel).ListWorkers(pb.ListWorkersRequest())
            return not reply.workers

    await wait_until(empty)
    await server.drain_and_stop(0)


async def test_registration_waits_for_an_absent_scheduler() -> None:
    server, port = await build_scheduler_server()
    await server.drain_and_stop(0)
    registration = WorkerRegistration(
        f"127.0.0.1:{port}", info("enc"), pb.WorkerLoad, interval_s=0.05, retry_max_s=0.1
    )
    await registration.start()
    await asyncio.sleep(0.3)
    assert not registration.is_registered
    server, _ = await build_scheduler_server(ServerOptions(port=port))

    async def registered() -> bool:
        return registration.is_registered

    await wait_until(registered)
    await registration.stop()
    await server.drain_and_stop(0)


async def test_no_scheduler_endpoint_is_a_no_op() -> None:
    registration = WorkerRegistration(None, info("enc"), pb.WorkerLoad)
    await registration.start()
    assert not registration.is_registered
    await registration.stop()
