"""The encode worker's logic: items in, embeddings out through the data plane (no grpc).

For each item: a cache hit by the caller's mm_hash answers at once; otherwise the image is loaded
under the media rules, hashed, looked up again, and encoded in a dynamic batch (concurrent
requests for the same image share one encoding). Results stream back as each is ready, cache
hits first. A payload is put into the data plane only when its item is about to be returned, so a
failed or cancelled request holds nothing.

An item given by mm_hash alone is answered from the cache or from an encoding of that image in
flight, else refused (MM_HASH_NOT_CACHED).

An item may carry its decoded pixels (a data-plane reference held by the route): read on this
host, they replace fetching and decoding the source, once they hash to the item's mm_hash; on any
failure to read them, or a mismatch, the source is loaded as if they were absent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from epd.common.errors import EpdError, InvalidArgument
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import CachedEmbedding, EmbeddingCache, Grid
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import mm_hash
from epd.server.media.loader import INLINE_DECODE_PIXELS, LoadedImage, MediaLoader
from epd.server.media.pixels import image_of
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2

MAX_ITEMS_PER_REQUEST = 64
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MediaSource:
    """One item as requested: optional known hash, a URL or bytes, optional decoded pixels."""

    mm_hash: str = ""
    url: str = ""
    data: bytes = b""
    pixels: tensor_pb2.TensorRef | None = None


@dataclass(frozen=True, slots=True)
class EncodedItem:
    """One result, ready to send."""

    item_index: int
    mm_hash: str
    embeddings: tensor_pb2.TensorRef
    grid: Grid
    cache_hit: bool
    encode_seconds: float
    batch_size: int = 0


@dataclass(frozen=True, slots=True)
class _Encoded:
    entry: CachedEmbedding
    batch_size: int


@dataclass(frozen=True, slots=True)
class _Computed:
    entry: CachedEmbedding
    mm_hash: str
    cache_hit: bool
    seconds: float
    batch_size: int = 0


class EncodeWorker:
    """Everything one encode process does, behind two calls: ``encode`` and ``release``."""

    def __init__(
        self,
        batcher: DynamicBatcher[Image.Image, tuple[torch.Tensor, Grid]],
        loader: MediaLoader,
        plane: DataPlane,
        cache: EmbeddingCache,
        *,
        worker_id: str,
        model_id: str,
        gridder: ImageGridder | None = None,
    ) -> None:
        """``gridder`` (the model's processor rules) refuses images the processor cannot take
        before they reach a batch; without it such an image fails in the tower."""
        self.batcher = batcher
        self.gridder = gridder
        self.loader = loader
        self.plane = plane
        self.cache = cache
        self.worker_id = worker_id
        self.model_id = model_id
        self._encoding: dict[str, asyncio.Task[_Encoded]] = {}
        self.num_in_flight = 0

    async def encode(
        self,
        items: list[MediaSource],
        *,
        model: str = "",
        consumer_host_id: str = "",
        consumer_device: str = "",
        transfer_kind: int = 0,
    ) -> AsyncIterator[EncodedItem]:
        """Encode ``items`` for a consumer on ``consumer_host_id`` that reads the embeddings into
        ``consumer_device`` (empty: host memory); yields one result per item, in completion
        order."""
        self._validate(items, model)
        if len(items) == 1:
            # NOTE: one item needs no task of its own: each costs a turn of the event loop.
            self.num_in_flight += 1
            try:
                computed = await self._compute(items[0])
            finally:
                self.num_in_flight -= 1
            yield self._hand_over(0, computed, consumer_host_id, consumer_device, transfer_kind)
            return
        tasks = [
            asyncio.ensure_future(self._compute_indexed(i, item)) for i, item in enumerate(items)
        ]
        for task in tasks:
            task.add_done_callback(_retrieve_exception)
        self.num_in_flight += len(items)
        try:
            for done in asyncio.as_completed(tasks):
                index, computed = await done
                yield self._hand_over(
                    index, computed, consumer_host_id, consumer_device, transfer_kind
                )
        finally:
            self.num_in_flight -= len(items)
            for task in tasks:
                task.cancel()

    def _hand_over(
        self,
        index: int,
        computed: _Computed,
        consumer_host_id: str,
        consumer_device: str,
        transfer_kind: int,
    ) -> EncodedItem:
        ref = self.plane.put(
            computed.entry.embeddings,
            consumer_host_id,
            consumer_device=consumer_device,
            preferred=transfer_kind,
        )
        return EncodedItem(
            index,
            computed.mm_hash,
            ref,
            computed.entry.grid,
            computed.cache_hit,
            computed.seconds,
            computed.batch_size,
        )

    def release(self, lease_ids: list[str]) -> int:
        """Free the payloads of ``lease_ids``; unknown ones are ignored."""
        return self.plane.release(lease_ids)

    def _validate(self, items: list[MediaSource], model: str) -> None:
        if not items:
            raise InvalidArgument("EncodeRequest has no items", reason="NO_ITEMS")
        if len(items) > MAX_ITEMS_PER_REQUEST:
            raise InvalidArgument(
                f"{len(items)} items in one request; the limit is {MAX_ITEMS_PER_REQUEST}",
                reason="TOO_MANY_ITEMS",
            )
        if model and model != self.model_id:
            raise InvalidArgument(
                f"this encoder serves {self.model_id!r}, not {model!r}", reason="WRONG_MODEL"
            )

    async def _compute_indexed(self, index: int, item: MediaSource) -> tuple[int, _Computed]:
        return index, await self._compute(item)

    async def _compute(self, item: MediaSource) -> _Computed:
        if item.mm_hash and (hit := self.cache.get(item.mm_hash)) is not None:
            return _Computed(hit, item.mm_hash, True, 0.0)
        if item.mm_hash and not (item.url or item.data):
            return await self._computed_elsewhere(item.mm_hash)
        loaded = await self._from_pixels(item)
        if loaded is None:
            loaded = await self.loader.load(url=item.url, data=item.data)
        if item.mm_hash and item.mm_hash != loaded.mm_hash:
            raise InvalidArgument(
                f"mm_hash {item.mm_hash} does not match the image ({loaded.mm_hash}); the caller "
                "hashes with another model id or processor",
                reason="MM_HASH_MISMATCH",
            )
        if not item.mm_hash and (hit := self.cache.get(loaded.mm_hash)) is not None:
            return _Computed(hit, loaded.mm_hash, True, 0.0)
        if self.gridder is not None:
            self.gridder.grid(loaded.image)  # raises InvalidArgument (BAD_IMAGE_SHAPE)
        start = time.monotonic()
        encoded = await self._encode_once(loaded.mm_hash, loaded.image)
        return _Computed(
            encoded.entry, loaded.mm_hash, False, time.monotonic() - start, encoded.batch_size
        )

    async def _from_pixels(self, item: MediaSource) -> LoadedImage | None:
        """The image of ``item.pixels`` if readable here and hashing to ``item.mm_hash``."""
        if item.pixels is None or not item.mm_hash:
            return None
        try:
            pixels = self.plane.get(item.pixels).numpy()
            # NOTE: building the image copies the pixels, then the hash walks them: off the loop
            # for all but small images, as the loader does for decoding.
            if pixels.size <= 3 * INLINE_DECODE_PIXELS:
                loaded = self._hashed(pixels)
            else:
                loaded = await asyncio.to_thread(self._hashed, pixels)
        except EpdError as e:
            logger.debug("pixels of %s unreadable here (%s): loading the source", item.mm_hash, e)
            return None
        if loaded.mm_hash != item.mm_hash:
            logger.warning(
                "pixels hash to %s, not to the item's mm_hash %s: loading the source",
                loaded.mm_hash,
                item.mm_hash,
            )
            return None
        return loaded

    def _hashed(self, pixels: np.ndarray) -> LoadedImage:
        image = image_of(pixels, self.loader.policy)
        return LoadedImage(
            image,
            mm_hash(
                image,
                model_id=self.loader.model_id,
                processor_fingerprint=self.loader.processor_fingerprint,
            ),
        )

    async def _computed_elsewhere(self, mm_hash: str) -> _Computed:
        """The embeddings of ``mm_hash`` from the cache or an encoding in flight."""
        if (hit := self.cache.get(mm_hash)) is not None:
            return _Computed(hit, mm_hash, True, 0.0)
        if (task := self._encoding.get(mm_hash)) is None:
            raise InvalidArgument(
                f"mm_hash {mm_hash} is not cached on this encoder; send the "
                "image (url or data) with it",
                reason="MM_HASH_NOT_CACHED",
            )
        start = time.monotonic()
        encoded = await asyncio.shield(task)
        return _Computed(
            encoded.entry, mm_hash, False, time.monotonic() - start, encoded.batch_size
        )

    async def _encode_once(self, mm_hash: str, image: Image.Image) -> _Encoded:
        # NOTE: the encoding runs in its own task, shared by every request for this image: a
        # request that is cancelled stops waiting without failing the others.
        task = self._encoding.get(mm_hash)
        if task is None:
            task = asyncio.ensure_future(self._encode_and_cache(mm_hash, image))
            task.add_done_callback(_retrieve_exception)
            self._encoding[mm_hash] = task
        return await asyncio.shield(task)

    async def _encode_and_cache(self, mm_hash: str, image: Image.Image) -> _Encoded:
        try:
            (embeddings, grid), batch_size = await self.batcher.submit_sized(image)
        finally:
            self._encoding.pop(mm_hash, None)
        entry = CachedEmbedding(embeddings, grid)
        self.cache.put(mm_hash, entry)
        return _Encoded(entry, batch_size)


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    # NOTE: when one item fails, the others' failures are not awaited; retrieve them here.
    if not task.cancelled():
        task.exception()
