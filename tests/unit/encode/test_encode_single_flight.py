"""One image asked by many requests at once runs the tower once on an encoder: the first request
encodes it, the others join that encoding or, when it ended while they loaded the image or asked
the store, take it from the cache; every one but the first says cache_hit."""

from __future__ import annotations

import asyncio

import torch

from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import CachedEmbedding, EmbeddingCache
from epd.server.encode.vision import Prepared
from epd.server.encode.worker import EncodeWorker, MediaSource
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.store.base import EmbeddingStore
from tests.unit.encode.test_encode_worker import FakeTower, RecordingPlane, collect, fake_prepare
from tests.unit.media.images import encode, noise

Grid = tuple[int, int, int]


class SlowSecondLookup(EmbeddingStore):
    """A store that holds nothing; its second lookup answers only once ``answer`` is set."""

    is_enabled = True

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.num_lookups = 0

    async def lookup(self, mm_hash: str) -> CachedEmbedding | None:
        self.num_lookups += 1
        if self.num_lookups == 2:
            await self.answer.wait()
        return None

    def publish(self, mm_hash: str, entry: CachedEmbedding) -> None:
        return None


def worker_of(tower: FakeTower, store: EmbeddingStore | None = None) -> EncodeWorker:
    batcher: DynamicBatcher[Prepared, tuple[torch.Tensor, Grid]] = DynamicBatcher(
        tower, max_items=8, max_wait_s=0.05
    )
    return EncodeWorker(
        batcher,
        fake_prepare,
        MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p"),
        RecordingPlane(),
        EmbeddingCache(1 << 20),
        worker_id="w",
        model_id="m",
        store=store,
    )


async def test_concurrent_requests_for_one_image_run_the_tower_once() -> None:
    tower = FakeTower()
    tower.gate.clear()
    worker = worker_of(tower)
    data = encode(noise(seed=5))
    requests = [asyncio.ensure_future(collect(worker, MediaSource(data=data))) for _ in range(6)]
    await asyncio.sleep(0.1)
    tower.gate.set()
    answers = [item for (item,) in await asyncio.gather(*requests)]
    await worker.batcher.close()
    assert tower.calls == [1]
    assert sorted(item.cache_hit for item in answers) == [False] + [True] * 5
    assert len({item.mm_hash for item in answers}) == 1


async def test_an_encoding_that_ended_meanwhile_answers_from_the_cache() -> None:
    tower = FakeTower()
    tower.gate.clear()
    store = SlowSecondLookup()
    worker = worker_of(tower, store)
    data = encode(noise(seed=6))
    first = asyncio.ensure_future(collect(worker, MediaSource(data=data)))
    second = asyncio.ensure_future(collect(worker, MediaSource(data=data)))
    while store.num_lookups < 2:
        await asyncio.sleep(0.01)
    tower.gate.set()
    ((encoded,),) = await asyncio.gather(first)
    store.answer.set()  # NOTE: the second asks the tower only now, the encoding having ended
    (joined,) = await second
    await worker.batcher.close()
    assert tower.calls == [1]
    assert not encoded.cache_hit and joined.cache_hit
