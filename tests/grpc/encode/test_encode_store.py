"""Encoders sharing a Mooncake store, in process: what encoder A encodes, a cold encoder B serves
from the store without running its tower, byte for byte; garbage in the store is refused and the
image encoded; with the master killed, requests are still answered and the failures counted in
the encoder's metrics."""

from __future__ import annotations

import asyncio
import time

import torch

from epd.common.channels import create_channel
from epd.common.server import ServerOptions
from epd.server.encode.app import EncodeApp, EncodeConfig, build_encode_server
from epd.server.store.base import Lookup, Publish
from epd.server.store.codec import store_key
from epd.server.transfer.plane import DataPlane
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2
from tests.grpc.encode.test_encode_service import encode, png
from tests.mooncake import kill, raw_client, running_master
from tests.scrape import scrape, value


async def encoder(model_dir, address) -> EncodeApp:
    config = EncodeConfig(
        model_dir,
        model_id="tiny",
        embedding_store="mooncake",
        store_master=address.master,
        store_metadata_server=address.metadata_server,
        store_timeout_ms=1000,
        store_segment_mb=32,
        store_buffer_mb=16,
    )
    app = await build_encode_server(config, ServerOptions(metrics_port=0))
    assert await app.worker.store.wait_connected(30)
    return app


async def ask(app: EncodeApp, data: bytes) -> tuple[pb.EncodeResponse, torch.Tensor]:
    """One image encoded by ``app``; its response and a copy of its embeddings, released."""
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        stub = pb_grpc.EncodeServiceStub(channel)
        (response,) = await encode(stub, multimodal_pb2.MediaItem(data=data))
        embeddings = DataPlane(app.worker.plane.host_id).get(response.embeddings, copy=True)
        await stub.Release(pb.ReleaseRequest(lease_ids=[response.embeddings.lease_id]))
    return response, embeddings


async def stored(app: EncodeApp, count: int) -> None:
    deadline = time.monotonic() + 10
    counts = app.worker.store.counts.publishes
    while counts[Publish.STORED] < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert counts[Publish.STORED] == count, counts


def tower_images(app: EncodeApp) -> int:
    return app.worker.batcher.stats.num_items


async def test_a_cold_encoder_serves_what_another_encoded_without_its_tower(
    tiny_model_dir, tmp_path
) -> None:
    async with running_master(tmp_path) as master:
        first, second = [await encoder(tiny_model_dir, master.address) for _ in range(2)]
        try:
            encoded, embeddings = await ask(first, png(401))
            await stored(first, 1)
            report = first.worker.cache.journal.take()  # what its next heartbeat says
            served, served_embeddings = await ask(second, png(401))
            again, _ = await ask(second, png(401))
            metrics = await asyncio.to_thread(
                scrape, f"http://127.0.0.1:{second.server.metrics.port}/metrics"
            )
        finally:
            await first.stop()
            await second.stop()
    assert not encoded.cache_hit and served.cache_hit and again.cache_hit
    assert report is not None and report.stored == (encoded.mm_hash,)
    assert (tower_images(first), tower_images(second)) == (1, 0)
    assert served.mm_hash == encoded.mm_hash and served.grid == encoded.grid
    assert torch.equal(served_embeddings.view(torch.uint8), embeddings.view(torch.uint8))
    assert second.worker.store.counts.lookups == {Lookup.HIT: 1}
    assert value(metrics, "epd_encode_store_lookups_total", outcome="hit") == 1
    assert value(metrics, "epd_encode_store_lookups_total", outcome="corrupt") == 0


async def test_garbage_in_the_store_is_refused_and_the_image_encoded(
    tiny_model_dir, tmp_path
) -> None:
    async with running_master(tmp_path) as master:
        app = await encoder(tiny_model_dir, master.address)
        client = raw_client(master.address)
        try:
            reference, expected = await ask(app, png(402))
            app.worker.cache._values.clear()  # NOTE: cold again, as after a restart
            await stored(app, 1)
            assert client.remove(store_key(reference.mm_hash), True) == 0
            assert client.put(store_key(reference.mm_hash), b"\x01" * 4096) == 0
            response, embeddings = await ask(app, png(402))
        finally:
            await app.stop()
            client.close()
    assert not response.cache_hit and tower_images(app) == 2
    assert torch.equal(embeddings, expected)
    assert app.worker.store.counts.lookups[Lookup.CORRUPT] == 1


async def test_requests_are_answered_after_the_master_is_killed(tiny_model_dir, tmp_path) -> None:
    async with running_master(tmp_path) as master:
        app = await encoder(tiny_model_dir, master.address)
        try:
            await ask(app, png(403))
            await stored(app, 1)
            kill(master)
            answers = [await ask(app, png(410 + i)) for i in range(3)]
            metrics = await asyncio.to_thread(
                scrape, f"http://127.0.0.1:{app.server.metrics.port}/metrics"
            )
        finally:
            await app.stop()
    assert [response.cache_hit for response, _ in answers] == [False] * 3
    assert tower_images(app) == 4
    failed = sum(
        value(metrics, "epd_encode_store_lookups_total", outcome=outcome)
        for outcome in ("error", "timeout", "unavailable")
    )
    assert failed == 3
