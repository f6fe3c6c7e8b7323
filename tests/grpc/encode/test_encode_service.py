"""EncodeService in-process: reference-equal embeddings, cache, batching, bad inputs, leaks."""

from __future__ import annotations

import asyncio
import io

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.transfer import shm
from epd.server.transfer.nixl_agent import is_available as is_nixl_available
from epd.server.transfer.plane import DataPlane
from epd.v1 import encode_service_pb2 as pb
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import multimodal_pb2, tensor_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc


def png(seed: int, size: tuple[int, int] = (96, 64)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
async def app(tiny_model_dir):
    encode_app = await build_encode_server(
        EncodeConfig(tiny_model_dir, model_id="tiny", max_batch_size=8, max_batch_wait_ms=50)
    )
    yield encode_app
    await encode_app.stop()
    assert not [name for name in shm.list_segments() if name.startswith(shm.process_prefix())]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)

    def embed(data: bytes) -> torch.Tensor:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        inputs = processor.image_processor(images=[image], return_tensors="pt")
        with torch.no_grad():
            return (
                model.eval()
                .model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
                .pooler_output
            )

    return embed


@pytest.fixture
async def stub(app):
    async with create_channel(f"127.0.0.1:{app.port}") as channel:
        yield pb_grpc.EncodeServiceStub(channel)


def request(*items: multimodal_pb2.MediaItem, **fields) -> pb.EncodeRequest:
    return pb.EncodeRequest(items=list(items), consumer_host_id=DataPlane().host_id, **fields)


async def encode(stub, *items: multimodal_pb2.MediaItem, **fields) -> list[pb.EncodeResponse]:
    return [response async for response in stub.Encode(request(*items, **fields))]


async def test_embeddings_equal_the_reference_vision_tower(app, stub, reference) -> None:
    data = png(1)
    (response,) = await encode(stub, multimodal_pb2.MediaItem(data=data))
    assert response.embeddings.WhichOneof("location") == "shm" and not response.cache_hit
    consumer = DataPlane(app.worker.plane.host_id)
    embeddings = consumer.get(response.embeddings, copy=True)
    assert torch.equal(embeddings, reference(data))
    assert (response.grid.t, response.grid.h, response.grid.w) == (1, 4, 6)
    assert response.encoder_id == app.worker.worker_id
    released = await stub.Release(pb.ReleaseRequest(lease_ids=[response.embeddings.lease_id]))
    assert released.num_released == 1
    assert app.worker.plane.held() == []


async def test_cache_hit_skips_the_tower(app, stub) -> None:
    data = png(2)
    (first,) = await encode(stub, multimodal_pb2.MediaItem(data=data))
    batches = app.worker.batcher.stats.num_batches
    (by_hash,) = await encode(stub, multimodal_pb2.MediaItem(mm_hash=first.mm_hash, data=data))
    (by_bytes,) = await encode(stub, multimodal_pb2.MediaItem(data=data))
    assert by_hash.cache_hit and by_bytes.cache_hit and by_hash.encode_seconds == 0
    assert app.worker.batcher.stats.num_batches == batches
    consumer = DataPlane(app.worker.plane.host_id)
    assert torch.equal(consumer.get(by_hash.embeddings), consumer.get(first.embeddings))
    app.worker.plane.release([r.embeddings.lease_id for r in (first, by_hash, by_bytes)])


async def test_concurrent_requests_share_tower_calls(app, stub, reference) -> None:
    images = [png(100 + i) for i in range(6)]
    batches = app.worker.batcher.stats.num_batches
    results = await asyncio.gather(
        *(encode(stub, multimodal_pb2.MediaItem(data=d)) for d in images)
    )
    assert app.worker.batcher.stats.num_batches - batches < len(images)
    consumer = DataPlane(app.worker.plane.host_id)
    for data, (response,) in zip(images, results, strict=True):
        assert torch.allclose(consumer.get(response.embeddings), reference(data), atol=1e-5)
    app.worker.plane.release([r.embeddings.lease_id for (r,) in results])


async def test_a_request_streams_cache_hits_first(app, stub) -> None:
    cached = png(3)
    (warm,) = await encode(stub, multimodal_pb2.MediaItem(data=cached))
    responses = await encode(
        stub,
        multimodal_pb2.MediaItem(data=png(4)),
        multimodal_pb2.MediaItem(mm_hash=warm.mm_hash, data=cached),
    )
    assert [r.item_index for r in responses] == [1, 0]
    assert [r.cache_hit for r in responses] == [True, False]
    app.worker.plane.release([r.embeddings.lease_id for r in (warm, *responses)])


async def test_another_host_gets_nixl_or_inline(app, stub) -> None:
    data = png(5)
    (local,) = await encode(stub, multimodal_pb2.MediaItem(data=data))
    (remote,) = [
        r
        async for r in stub.Encode(
            pb.EncodeRequest(
                items=[multimodal_pb2.MediaItem(data=data)], consumer_host_id="another-host"
            )
        )
    ]
    expected = "nixl" if is_nixl_available() else "inline_data"
    assert remote.embeddings.WhichOneof("location") == expected and remote.cache_hit
    other_host = DataPlane("another-host")
    try:
        embeddings = other_host.get(remote.embeddings, copy=True)
    finally:
        other_host.close()
    assert torch.equal(
        embeddings, DataPlane(app.worker.plane.host_id).get(local.embeddings, copy=True)
    )
    app.worker.plane.release([local.embeddings.lease_id, remote.embeddings.lease_id])
    assert app.worker.plane.held() == []


async def test_the_request_can_ask_for_inline(app, stub) -> None:
    (response,) = await encode(
        stub, multimodal_pb2.MediaItem(data=png(5)), transfer_kind=tensor_pb2.TRANSFER_KIND_INLINE
    )
    assert response.embeddings.WhichOneof("location") == "inline_data"
    assert app.worker.plane.held() == []


async def test_the_consumers_device_reaches_the_data_plane(app, stub, monkeypatch) -> None:
    put, devices = app.worker.plane.put, []

    def recording_put(tensor, consumer_host_id="", **options):
        devices.append(options.get("consumer_device"))
        return put(tensor, consumer_host_id, **options)

    monkeypatch.setattr(app.worker.plane, "put", recording_put)
    (response,) = await encode(
        stub, multimodal_pb2.MediaItem(data=png(6)), consumer_device="cuda:0"
    )
    app.worker.plane.release([response.embeddings.lease_id])
    assert devices == ["cuda:0"] and app.worker.plane.held() == []


def bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (6000, 6000)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "items, fields, reason",
    [
        ([], {}, "NO_ITEMS"),
        ([multimodal_pb2.MediaItem(data=b"not an image")], {}, "BAD_IMAGE"),
        ([multimodal_pb2.MediaItem(data=png(6)[:100])], {}, "BAD_IMAGE"),
        ([multimodal_pb2.MediaItem(url="http://127.0.0.1:9/x.png")], {}, "PRIVATE_ADDRESS"),
        ([multimodal_pb2.MediaItem(url="file:///etc/passwd")], {}, "LOCAL_FILES_FORBIDDEN"),
        ([multimodal_pb2.MediaItem(url="data:image/png;base64,!!")], {}, "BAD_DATA_URL"),
        ([multimodal_pb2.MediaItem()], {}, "BAD_MEDIA_ITEM"),
        ([multimodal_pb2.MediaItem(data=png(7))], {"model": "llama"}, "WRONG_MODEL"),
        ([multimodal_pb2.MediaItem(mm_hash="0" * 32, data=png(7))], {}, "MM_HASH_MISMATCH"),
        ([multimodal_pb2.MediaItem(data=bomb())], {}, "TOO_MANY_PIXELS"),
        ([multimodal_pb2.MediaItem(data=png(8, (4020, 20)))], {}, "BAD_IMAGE_SHAPE"),
        ([multimodal_pb2.MediaItem(data=b"\0" * (21 << 20))], {}, "IMAGE_TOO_LARGE"),
        ([multimodal_pb2.MediaItem(url="ftp://example.com/x.png")], {}, "UNSUPPORTED_SCHEME"),
        ([multimodal_pb2.MediaItem(url="http://0x7f000001/x.png")], {}, "PRIVATE_ADDRESS"),
    ],
)
async def test_bad_inputs_are_invalid_argument(app, stub, items, fields, reason) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await encode(stub, *items, **fields)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == reason
    assert app.worker.plane.held() == []


async def test_registers_with_the_scheduler(tiny_model_dir) -> None:
    scheduler, port = await build_scheduler_server()
    encoder = await build_encode_server(
        EncodeConfig(
            tiny_model_dir, model_id="tiny", scheduler=f"127.0.0.1:{port}", worker_id="enc-cpu"
        )
    )
    async with create_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        for _ in range(100):
            workers = (await stub.ListWorkers(scheduler_pb.ListWorkersRequest())).workers
            if workers:
                break
            await asyncio.sleep(0.05)
    (worker,) = workers
    assert worker.info.id == "enc-cpu" and worker.info.device == "cpu"
    assert worker.info.role == scheduler_pb.WORKER_ROLE_ENCODE and worker.info.model == "tiny"
    await encoder.stop()
    async with create_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        assert not (await stub.ListWorkers(scheduler_pb.ListWorkersRequest())).workers
    await scheduler.drain_and_stop(0)
