"""An encoder's Prometheus metrics, scraped over HTTP from in-process servers: cache, batches,
refusals and leases count what happened, and two servers in one process keep their own."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from epd.common.channels import create_channel
from epd.common.server import ServerOptions
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.encode.test_encode_service import png, request
from tests.scrape import scrape, value


async def samples_of(app):
    return await asyncio.to_thread(scrape, f"http://127.0.0.1:{app.server.metrics.port}/metrics")


async def test_metrics_count_cache_batches_refusals_and_leases(tiny_model_dir) -> None:
    options = ServerOptions(metrics_port=0)
    config = EncodeConfig(tiny_model_dir, model_id="tiny", cache_mb=4096 / (1 << 20))
    first, second = [await build_encode_server(config, options) for _ in range(2)]
    try:
        async with create_channel(f"127.0.0.1:{first.port}") as channel:
            stub = pb_grpc.EncodeServiceStub(channel)
            item = multimodal_pb2.MediaItem(data=png(31))
            responses = [r async for r in stub.Encode(request(item))]
            responses += [r async for r in stub.Encode(request(item))]
            responses += [
                r async for r in stub.Encode(request(multimodal_pb2.MediaItem(data=png(32))))
            ]
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Encode(request(multimodal_pb2.MediaItem(data=b"not an image"))).read()
            held = await samples_of(first)
            await stub.Release(
                pb.ReleaseRequest(lease_ids=[r.embeddings.lease_id for r in responses])
            )
        released = await samples_of(first)
        other = await samples_of(second)
    finally:
        await first.stop()
        await second.stop()
    assert [r.cache_hit for r in responses] == [False, True, False]
    assert value(held, "epd_encode_cache_hits_total") == 1
    assert value(held, "epd_encode_cache_misses_total") == 2
    # NOTE: a 4 KiB cache holds one tiny image's embeddings (3 KiB): the second evicts the first
    assert value(held, "epd_encode_cache_evictions_total") == 1
    assert value(held, "epd_encode_cache_entries") == 1
    assert value(held, "epd_encode_images_total") == 2
    assert value(held, "epd_encode_batch_size_count") == 2
    assert value(held, "epd_encode_batch_size_sum") == 2
    assert value(held, "epd_encode_batch_duration_seconds_count") == 2
    assert value(held, "epd_media_refusals_total", reason="BAD_IMAGE") == 1
    assert value(held, "epd_encode_queue_depth") == 0
    assert value(held, "epd_transfer_leases_outstanding", kind="shm") == 3
    nbytes = sum(r.embeddings.byte_size for r in responses)
    assert value(held, "epd_transfer_leased_bytes", kind="shm") == nbytes
    assert value(held, "epd_transfer_bytes_total", kind="shm", direction="put") == nbytes
    assert value(held, "epd_transfer_shm_segments") >= 1
    assert value(released, "epd_transfer_leases_outstanding", kind="shm") == 0
    assert value(released, "epd_transfer_leases_expired_total", kind="shm") == 0
    assert value(other, "epd_encode_images_total") == 0
    assert value(other, "epd_encode_cache_misses_total") == 0
    assert value(other, "process_resident_memory_bytes") > 0


async def test_no_metrics_port_serves_none(tiny_model_dir) -> None:
    app = await build_encode_server(EncodeConfig(tiny_model_dir, model_id="tiny"))
    try:
        assert app.server.metrics is None
    finally:
        await app.stop()


async def test_metrics_port_closes_with_the_server(tiny_model_dir) -> None:
    app = await build_encode_server(
        EncodeConfig(tiny_model_dir, model_id="tiny"), ServerOptions(metrics_port=0)
    )
    await samples_of(app)
    await app.stop()
    with pytest.raises(OSError):
        await samples_of(app)
