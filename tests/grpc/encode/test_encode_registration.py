"""An encoder whose scheduler is absent serves direct calls, registers once the scheduler comes
up, and heartbeats its load (what its cache holds and how many batches it ran included)."""

from __future__ import annotations

import asyncio
import io
import socket

from PIL import Image

from epd.common.channels import create_channel
from epd.common.server import ServerOptions
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_late_scheduler_gets_registration_and_load(tiny_model_dir) -> None:
    port = free_port()
    encoder = await build_encode_server(
        EncodeConfig(
            tiny_model_dir,
            model_id="tiny",
            scheduler=f"127.0.0.1:{port}",
            worker_id="enc-late",
            transfer_kind="inline",
            heartbeat_interval_s=0.1,
            max_batch_size=8,
        )
    )
    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), (9, 9, 9)).save(buffer, format="PNG")
    try:
        async with create_channel(f"127.0.0.1:{encoder.port}") as channel:
            request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(data=buffer.getvalue())])
            (response,) = [r async for r in pb_grpc.EncodeServiceStub(channel).Encode(request)]
        scheduler, _ = await build_scheduler_server(ServerOptions(port=port))
        async with create_channel(f"127.0.0.1:{port}") as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            workers = []
            for _ in range(300):
                # NOTE: wait_for_ready: the subchannel is shared with the encoder's registration
                # channel, which may still be in reconnect backoff from the refused attempts.
                reply = await stub.ListWorkers(
                    scheduler_pb.ListWorkersRequest(), wait_for_ready=True, timeout=10
                )
                workers = list(reply.workers)
                held = workers[0].load.held_items.added_mm_hashes if workers else []
                if response.mm_hash in held:
                    break
                await asyncio.sleep(0.05)
        (worker,) = workers
        assert worker.info.id == "enc-late" and worker.info.host_id == encoder.worker.plane.host_id
        assert worker.info.capacity == 8 and worker.info.endpoint.endswith(f":{encoder.port}")
        assert worker.load.held_items.is_snapshot
        assert list(worker.load.held_items.added_mm_hashes) == [response.mm_hash]
        assert worker.load.batches_finished == 1 and worker.load.item_latency_ms > 0
    finally:
        await encoder.stop()
    await scheduler.drain_and_stop(0)


async def test_an_encoder_bound_to_a_wildcard_registers_its_route_to_the_scheduler(
    tiny_model_dir,
) -> None:
    scheduler, scheduler_port = await build_scheduler_server()
    encoder = await build_encode_server(
        EncodeConfig(
            tiny_model_dir,
            model_id="tiny",
            scheduler=f"127.0.0.1:{scheduler_port}",
            worker_id="enc-any",
            transfer_kind="inline",
        ),
        ServerOptions(host="0.0.0.0"),
    )
    try:
        async with create_channel(f"127.0.0.1:{scheduler_port}") as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            workers: list[scheduler_pb.WorkerStatus] = []
            for _ in range(200):
                workers = list((await stub.ListWorkers(scheduler_pb.ListWorkersRequest())).workers)
                if workers:
                    break
                await asyncio.sleep(0.05)
        (worker,) = workers
        assert worker.info.endpoint == f"127.0.0.1:{encoder.port}"
        async with create_channel(worker.info.endpoint) as channel:
            request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(data=png_bytes())])
            assert [r async for r in pb_grpc.EncodeServiceStub(channel).Encode(request)]
    finally:
        await encoder.stop()
        await scheduler.drain_and_stop(0)


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), (3, 4, 5)).save(buffer, format="PNG")
    return buffer.getvalue()
