"""EncodeWorker logic with a fake tower: shared encodings survive a cancelled requester, hash-only
items, batch sizes, failures, the consumer's device handed to the data plane, and what is held
afterwards."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
import torch

from epd.common.errors import InvalidArgument
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import EmbeddingCache
from epd.server.encode.vision import Prepared
from epd.server.encode.worker import EncodedItem, EncodeWorker, MediaSource
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2
from tests.unit.media.images import encode, noise

Grid = tuple[int, int, int]


def fake_prepare(pixels: torch.Tensor, settings: ImageSettings = NO_IMAGE_SETTINGS) -> Prepared:
    """An image's pixels made ready for ``FakeTower``: a copy of them (read before returning),
    whatever the pixel budget."""
    return Prepared(pixels.clone(), torch.tensor([[1, 2, 2]]))


class FakeTower:
    """Embeds an image as one row: the sum of its first pixel's channels; blocks while ``gate``
    is clear."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, images: list[Prepared]) -> list[tuple[torch.Tensor, Grid]]:
        self.gate.wait(10)
        self.calls.append(len(images))
        return [
            (torch.tensor([[float(image.pixel_values[0, 0].sum())]]), (1, 2, 2)) for image in images
        ]


def new_worker(
    batcher: DynamicBatcher[Prepared, tuple[torch.Tensor, Grid]],
    plane: DataPlane,
    loader: MediaLoader | None = None,
) -> EncodeWorker:
    """A worker of ``batcher`` (a ``FakeTower``'s) handing over through ``plane``."""
    loader = loader or MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    return EncodeWorker(
        batcher,
        fake_prepare,
        loader,
        plane,
        EmbeddingCache(1 << 20),
        worker_id="w",
        model_id="m",
    )


class RecordingPlane(DataPlane):
    """An inline data plane on host-a that records the consumer device of every put."""

    def __init__(self) -> None:
        super().__init__("host-a", kinds=("inline",))
        self.consumer_devices: list[str] = []

    def put(
        self,
        tensor: torch.Tensor,
        consumer_host_id: str = "",
        *,
        consumer_device: str = "",
        preferred: int = tensor_pb2.TRANSFER_KIND_UNSPECIFIED,
        ttl_s: float | None = None,
        content_tag: bytes = b"",
    ) -> tensor_pb2.TensorRef:
        self.consumer_devices.append(consumer_device)
        return super().put(
            tensor,
            consumer_host_id,
            consumer_device=consumer_device,
            preferred=preferred,
            ttl_s=ttl_s,
            content_tag=content_tag,
        )


@pytest.fixture
async def parts() -> AsyncIterator[tuple[EncodeWorker, FakeTower]]:
    tower = FakeTower()
    batcher: DynamicBatcher[Prepared, tuple[torch.Tensor, Grid]] = DynamicBatcher(
        tower, max_items=8, max_wait_s=0.5
    )  # NOTE: generous, so a loaded box still batches
    plane = RecordingPlane()
    worker = new_worker(batcher, plane)
    yield worker, tower
    await batcher.close()
    assert plane.held() == [] and worker.num_in_flight == 0
    plane.close()


async def collect(worker: EncodeWorker, *sources: MediaSource) -> list[EncodedItem]:
    return [item async for item in worker.encode(list(sources), consumer_host_id="host-a")]


async def test_a_cancelled_request_does_not_fail_one_sharing_its_image(parts) -> None:
    worker, tower = parts
    tower.gate.clear()
    data = encode(noise(seed=1))
    first = asyncio.ensure_future(collect(worker, MediaSource(data=data)))
    second = asyncio.ensure_future(collect(worker, MediaSource(data=data)))
    await asyncio.sleep(0.1)
    first.cancel()
    tower.gate.set()
    (item,) = await second
    # NOTE: the second joined the first's encoding: no tower ran for it (cache_hit)
    assert first.cancelled() and item.cache_hit and item.batch_size == 1
    assert tower.calls == [1]


async def test_concurrent_requests_report_their_batch_size(parts) -> None:
    worker, tower = parts
    results = await asyncio.gather(
        *(collect(worker, MediaSource(data=encode(noise(seed=s)))) for s in range(3))
    )
    assert tower.calls == [3] and [r.batch_size for (r,) in results] == [3, 3, 3]
    (again,) = await collect(worker, MediaSource(mm_hash=results[0][0].mm_hash))
    assert again.cache_hit and again.batch_size == 0 and tower.calls == [3]


async def test_a_hash_the_encoder_lacks_needs_the_image(parts) -> None:
    worker, _ = parts
    with pytest.raises(InvalidArgument) as caught:
        await collect(worker, MediaSource(mm_hash="f" * 32))
    assert caught.value.reason == "MM_HASH_NOT_CACHED"


async def test_two_bad_items_fail_the_request_once(parts) -> None:
    worker, tower = parts
    with pytest.raises(InvalidArgument) as caught:
        await collect(
            worker,
            MediaSource(data=b"junk"),
            MediaSource(data=b"more junk"),
            MediaSource(data=encode(noise(seed=9))),
        )
    assert caught.value.reason == "BAD_IMAGE" and worker.num_in_flight == 0
    (item,) = await collect(worker, MediaSource(data=encode(noise(seed=9))))
    assert item.embeddings.byte_size == 4


async def by_hash(worker: EncodeWorker, mm_hash: str) -> list[EncodedItem]:
    return [
        item
        async for item in worker.encode([MediaSource(mm_hash=mm_hash)], consumer_host_id="host-a")
    ]


async def test_a_hash_only_item_shares_an_encoding_in_flight(parts) -> None:
    worker, tower = parts
    tower.gate.clear()
    data = encode(noise(seed=5))
    sending = asyncio.ensure_future(collect(worker, MediaSource(data=data)))
    await asyncio.sleep(0.05)
    mm_hash = (await worker.loader.load(data=data)).mm_hash
    pulling = asyncio.ensure_future(by_hash(worker, mm_hash))
    await asyncio.sleep(0.05)
    tower.gate.set()
    (sent,), (pulled,) = await asyncio.wait_for(asyncio.gather(sending, pulling), 5)
    assert pulled.mm_hash == sent.mm_hash and pulled.embeddings == sent.embeddings
    assert tower.calls == [1]


async def test_a_hash_only_item_neither_cached_nor_in_flight_is_refused(parts) -> None:
    worker, tower = parts
    with pytest.raises(InvalidArgument) as caught:
        await by_hash(worker, "e" * 32)
    assert caught.value.reason == "MM_HASH_NOT_CACHED" and tower.calls == []
    assert (worker.cache.num_misses, worker.cache.num_hits) == (1, 0)  # NOTE: one lookup, one miss


async def test_the_consumers_device_reaches_the_data_plane(parts) -> None:
    worker, _ = parts
    sources = [MediaSource(data=encode(noise(seed=s))) for s in (11, 12)]
    for items in ([sources[0]], sources):  # one item, and a batch
        async for _ in worker.encode(items, consumer_host_id="host-a", consumer_device="cuda:0"):
            pass
    assert worker.plane.consumer_devices == ["cuda:0"] * 3
