"""The encode worker's logic: items in, embeddings out through the data plane (no grpc).

For each item: a cache hit by the caller's mm_hash answers at once; otherwise the image is loaded
under the media rules, hashed, looked up again, and encoded in a dynamic batch (concurrent
requests for the same image share one encoding). Results stream back as each is ready, cache
hits first. A payload is put into the data plane only when its item is about to be returned, so a
failed or cancelled request holds nothing.

With a deployment-wide embedding store (``server/store``), a miss in the cache is looked up there
before the image is encoded (a hit fills the cache and runs no tower), and what is encoded is
published to it; the store never fails nor delays a request.

An item given by mm_hash alone is answered from the cache, the store or an encoding of that image
in flight, else refused (MM_HASH_NOT_CACHED).

An item may carry its decoded pixels (a data-plane reference held by the route): read on this
host and found tagged with the item's mm_hash (``preparing``), they replace fetching, decoding
and hashing the source; on any failure to read them, or another tag, the source is loaded as if
they were absent. Content from anywhere else (a URL, bytes) is decoded and hashed here, and an
mm_hash sent with it must match.

Images are made ready for the tower (the model's processor) one by one in a pool, in parallel
with the tower running the previous batch (``preparing.Preparer``); the batcher then runs the
tower alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

import torch

from epd.common.errors import InvalidArgument, Unavailable
from epd.common.tasks import retrieve_exception
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import CachedEmbedding, EmbeddingCache, Grid
from epd.server.encode.preparing import (
    PrepareImage,
    Preparer,
    PrepareVideo,
    SharedPixels,
    Source,
    VideoFrames,
)
from epd.server.encode.video_items import VideoSpan, frames_from_source
from epd.server.encode.vision import Prepared
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import embeddings_tag, is_mm_hash, salted, under_settings
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings, check_floor
from epd.server.media.loader import MediaLoader
from epd.server.media.video_loader import VideoLoader
from epd.server.store.base import EmbeddingStore, NoStore
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2

MAX_ITEMS_PER_REQUEST = 64


@dataclass(frozen=True, slots=True)
class MediaSource:
    """One item as requested: optional known hash, a URL or bytes, optional decoded pixels."""

    mm_hash: str = ""
    url: str = ""
    data: bytes = b""
    pixels: tensor_pb2.TensorRef | None = None
    # set for a chunk of a video: its frames among the kept ones (mm_hash: the chunk's hash)
    video: VideoSpan | None = None
    # a tenant's item: the salt its mm_hash was salted with (``hashing.salted``; "": none)
    key_salt: str = ""
    # an image's pixel budget (mm_hash covers it: ``hashing.under_settings``; none: the model's)
    image_settings: ImageSettings = NO_IMAGE_SETTINGS


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


class _PixelsUnread(Exception):
    """The route's shared pixels could not be read here: nothing was encoded (not cached)."""


@dataclass(frozen=True, slots=True)
class _Computed:
    entry: CachedEmbedding
    mm_hash: str
    # the cache, the store or another request's encoding answered: no tower ran for this one
    cache_hit: bool
    seconds: float = 0.0
    batch_size: int = 0


class EncodeWorker:
    """Everything one encode process does, behind one call, ``encode``; its payloads are freed
    through its data plane (``plane.release``)."""

    def __init__(
        self,
        batcher: DynamicBatcher[Prepared, tuple[torch.Tensor, Grid]],
        prepare: PrepareImage,
        loader: MediaLoader,
        plane: DataPlane,
        cache: EmbeddingCache,
        *,
        worker_id: str,
        model_id: str,
        gridder: ImageGridder | None = None,
        pool: Executor | None = None,
        store: EmbeddingStore | None = None,
        prepare_video: PrepareVideo | None = None,
        videos: VideoLoader | None = None,
    ) -> None:
        """``batcher`` runs the tower on prepared images, ``prepare`` (thread-safe) makes an image's
        RGB pixels ready for it (resized within a pixel budget), in ``pool`` (None:
        asyncio's default executor; the loader should decode there too). ``gridder`` (the
        model's processor rules) refuses images the processor cannot take before they reach
        a batch; without it such an image fails in the tower. ``store``: the deployment's
        embedding store (None: none). ``prepare_video`` (thread-safe) makes a video chunk's
        frames ready for the tower, ``videos`` loads a video from its source where the
        route's frames cannot be read (None: video items are refused, VIDEO_NOT_SUPPORTED)."""
        self.videos = videos
        self.batcher = batcher
        self.preparer = Preparer(
            prepare, plane, loader.policy, pool=pool, prepare_video=prepare_video
        )
        self.gridder = gridder
        self.loader = loader
        self.plane = plane
        self.cache = cache
        self.store = store or NoStore()
        self.store.on_stored = cache.journal.stored
        self.worker_id = worker_id
        self.model_id = model_id
        self.num_in_flight = 0
        self.is_draining = False

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
        order. Refused (UNAVAILABLE, reason DRAINING) once draining."""
        if self.is_draining:
            raise Unavailable(
                f"encoder {self.worker_id} is draining; ask another", reason="DRAINING"
            )
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
            task.add_done_callback(retrieve_exception)
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
            content_tag=embeddings_tag(computed.mm_hash),
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

    async def stop_taking_work(self) -> None:
        """Refuse new ``encode`` calls (drain); those in flight finish."""
        self.is_draining = True

    def is_settled(self) -> bool:
        """Whether nothing is in flight and every payload handed over was released (or its
        lease expired): a draining encoder may then stop without failing a consumer."""
        return self.num_in_flight == 0 and not self.plane.held()

    async def close(self) -> None:
        """Stop the tower's batcher and the preparing pool (waiting items fail)."""
        await self.batcher.close()
        await self.store.close()
        for executor in (self.preparer.pool, self.batcher.executor):
            if isinstance(executor, ThreadPoolExecutor):
                executor.shutdown(wait=False, cancel_futures=True)

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
        for item in items:
            if item.image_settings.settings:
                check_floor(item.image_settings, self.loader.policy.max_pixels)

    async def _compute_indexed(self, index: int, item: MediaSource) -> tuple[int, _Computed]:
        return index, await self._compute(item)

    async def _compute(self, item: MediaSource) -> _Computed:
        if item.mm_hash and (known := await self._cached_or_stored(item.mm_hash)) is not None:
            return known
        if item.mm_hash and not (item.url or item.data):
            return await self._computed_elsewhere(item.mm_hash)
        if item.video is not None:
            return await self._compute_video(item, item.video)
        settings = item.image_settings
        if item.pixels is not None and is_mm_hash(item.mm_hash):
            shared = SharedPixels(item.pixels, item.mm_hash)
            if (computed := await self._encode_once(item.mm_hash, shared, settings)) is not None:
                return computed
        loaded = await self.loader.load(url=item.url, data=item.data)
        # NOTE: its keys are its hash under its budget, salted for a tenant's item
        name = salted(under_settings(loaded.mm_hash, settings.key), item.key_salt)
        loaded = replace(loaded, mm_hash=name)
        if item.mm_hash and item.mm_hash != loaded.mm_hash:
            raise InvalidArgument(
                f"mm_hash {item.mm_hash} does not match the image ({loaded.mm_hash}); the caller "
                "hashes with another model id or processor",
                reason="MM_HASH_MISMATCH",
            )
        if not item.mm_hash and (known := await self._cached_or_stored(loaded.mm_hash)) is not None:
            return known
        if self.gridder is not None:
            # NOTE: raises InvalidArgument (BAD_IMAGE_SHAPE); the route checked its own images.
            self.gridder.grid_of_size(loaded.width, loaded.height, settings)
        start = time.monotonic()
        computed = None
        while computed is None:
            # NOTE: None only where this joined another request's encoding from shared pixels
            # that could not be read: that one has ended, so the next call encodes these.
            computed = await self._encode_once(loaded.mm_hash, loaded, settings, start)
        return computed

    async def _compute_video(self, item: MediaSource, span: VideoSpan) -> _Computed:
        """A video chunk's embeddings: from the route's shared frames, else from the video's
        source, decoded and planned here."""
        if self.preparer.prepare_video is None or self.videos is None:
            raise InvalidArgument("this encoder takes no video", reason="VIDEO_NOT_SUPPORTED")
        if not is_mm_hash(item.mm_hash):
            raise InvalidArgument("a video item needs its chunk's mm_hash", reason="BAD_VIDEO_SPAN")
        start = time.monotonic()
        computed = None
        if item.pixels is not None:
            shared = SharedPixels(item.pixels, item.mm_hash, span)
            computed = await self._encode_once(item.mm_hash, shared, started=start)
        if computed is None:
            frames = await frames_from_source(
                self.videos, item.url, item.data, span, item.mm_hash, item.key_salt
            )
        while computed is None:
            source = VideoFrames(frames, span)
            computed = await self._encode_once(item.mm_hash, source, started=start)
        return computed

    async def _cached_or_stored(self, mm_hash: str) -> _Computed | None:
        """The embeddings of ``mm_hash`` from the cache, else from the deployment's store (then
        cached too); None on a miss in both (the store counts why)."""
        if (hit := self.cache.get(mm_hash)) is not None:
            return _Computed(hit, mm_hash, True, 0.0)
        if not self.store.is_enabled or (entry := await self.store.lookup(mm_hash)) is None:
            return None
        self.cache.put(mm_hash, entry)
        return _Computed(entry, mm_hash, True, 0.0)

    async def _computed_elsewhere(self, mm_hash: str) -> _Computed:
        """The embeddings of ``mm_hash`` from an encoding in flight, or the cache where one ended
        while the store was asked (the miss was counted, by ``_cached_or_stored``)."""
        if (hit := self.cache.get(mm_hash, count_miss=False)) is not None:
            return _Computed(hit, mm_hash, True, 0.0)
        start = time.monotonic()
        try:
            entry = await self.cache.join(mm_hash)
        except _PixelsUnread:
            entry = None
        if entry is None:
            raise InvalidArgument(
                f"mm_hash {mm_hash} is not cached on this encoder; send the "
                "image (url or data) with it",
                reason="MM_HASH_NOT_CACHED",
            )
        return _Computed(entry, mm_hash, True, time.monotonic() - start, entry.batch_size)

    async def _encode_once(
        self,
        mm_hash: str,
        source: Source,
        settings: ImageSettings = NO_IMAGE_SETTINGS,
        started: float | None = None,
    ) -> _Computed | None:
        """The embeddings of ``source`` (an image's resized within ``settings``), encoded once
        whoever asks for ``mm_hash`` meanwhile (a cache hit for all but the first, and when an
        encoding ended while this request loaded the image or asked the store), their seconds
        counted from ``started`` (``time.monotonic()``; None: now); None if ``source`` is
        shared pixels that cannot be read (nothing was encoded)."""
        started = time.monotonic() if started is None else started
        if (hit := self.cache.get(mm_hash, count_miss=False)) is not None:
            return _Computed(hit, mm_hash, True, time.monotonic() - started)
        # NOTE: the cache runs the encoding in its own task, shared by every request for this
        # image: a request that is cancelled stops waiting without failing the others.
        encoded: list[bool] = []  # NOTE: marked by this request's encoding, not one it joined
        encode = partial(self._encode, mm_hash, source, settings, encoded)
        try:
            entry = await self.cache.get_or_load(mm_hash, encode)
        except _PixelsUnread:
            return None
        seconds = time.monotonic() - started
        return _Computed(entry, mm_hash, not encoded, seconds, entry.batch_size)

    async def _encode(
        self, mm_hash: str, source: Source, settings: ImageSettings, encoded: list[bool]
    ) -> CachedEmbedding:
        """``source`` run through the tower (``encoded`` marked), published to the store."""
        prepared = await self.preparer.prepare(source, settings)
        if prepared is None:
            raise _PixelsUnread
        encoded.append(True)
        (embeddings, grid), batch_size = await self.batcher.submit_sized(prepared)
        entry = CachedEmbedding(embeddings, grid, batch_size)
        if self.store.is_enabled:
            self.store.publish(mm_hash, entry)
        return entry
