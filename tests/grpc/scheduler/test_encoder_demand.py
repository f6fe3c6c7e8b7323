"""GetEncoderDemand over gRPC: the encoders each kind needs, from what the scheduler measured."""

from __future__ import annotations

import pytest

from epd.common.channels import create_channel
from epd.scheduler.app import build_scheduler_server
from epd.scheduler.config import SchedulerConfig
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.grpc.scheduler.test_scheduler_service import info


@pytest.fixture
async def stub():
    config = SchedulerConfig(ttl_s=30, encode_wait_target_s=0.1, demand_smoothing_s=60)
    server, port = await build_scheduler_server(config=config)
    channel = create_channel(f"127.0.0.1:{port}")
    yield pb_grpc.SchedulerServiceStub(channel)
    await channel.close()
    await server.drain_and_stop(0)


async def test_demand_follows_arrivals_and_measured_costs(stub) -> None:
    for worker_id, device, port in (("cpu0", "cpu", 7001), ("gpu0", "cuda:0", 7002)):
        await stub.RegisterWorker(
            pb.RegisterWorkerRequest(worker=info(worker_id, port=port, device=device))
        )
    assert (await stub.GetEncoderDemand(pb.GetEncoderDemandRequest(model="x"))).demands == []
    idle = await stub.GetEncoderDemand(pb.GetEncoderDemandRequest())
    assert idle.wait_target_seconds == pytest.approx(0.1)
    assert [(d.device, d.num_live, d.num_needed, d.image_cost_seconds) for d in idle.demands] == [
        ("cpu", 1, 1, 0.0),
        ("cuda", 1, 1, 0.0),
    ]
    await encode(stub, 2, 400.0)  # one image on each: both costs measured
    measured = await stub.GetEncoderDemand(pb.GetEncoderDemandRequest(model="m"))
    for demand in measured.demands:
        assert demand.model == "m" and demand.num_live == 1
        assert demand.image_cost_seconds == pytest.approx(0.4)
        assert demand.arrival_images_per_second == pytest.approx(1 / 60, rel=0.01)
        assert demand.load_encoders == pytest.approx(
            demand.arrival_images_per_second * demand.image_cost_seconds
        )
        assert demand.num_needed == 1
    # 40 images at once: a backlog no single encoder of either kind clears within 0.1 s
    backlog = await encode(stub, 40, None)
    for demand in backlog.demands:
        assert demand.backlog_seconds > 1 and demand.num_needed > 10


async def encode(stub, num_items: int, latency_ms: float | None) -> pb.GetEncoderDemandResponse:
    """Assign ``num_items`` images and report them done in ``latency_ms`` (None: not yet); the
    demand once assigned."""
    items = [pb.EncodeItem(mm_hash=f"h{num_items}-{i}", num_tokens=64) for i in range(num_items)]
    assignment = await stub.AssignEncoders(pb.AssignEncodersRequest(items=items))
    demand = await stub.GetEncoderDemand(pb.GetEncoderDemandRequest())
    if latency_ms is not None:
        outcomes = [pb.ItemOutcome(item_index=i, latency_ms=latency_ms) for i in range(num_items)]
        request = pb.CompleteEncodingRequest(
            assignment_id=assignment.assignment_id, outcomes=outcomes
        )
        await stub.CompleteEncoding(request)
    return demand
