"""The embedding store on Mooncake Store (``mooncake.store.MooncakeDistributedStore``, TCP).

Every call into Mooncake blocks (after the master died, each takes about 4 s), so none runs on
the event loop: ``setup``, then every publish, run in one daemon writer thread fed by a bounded
queue; lookups run in ``NUM_READERS`` reader threads, each waited
for at most ``timeout_s``. A lookup that finds every reader still busy with a slow call is not
asked (``Lookup.UNAVAILABLE``), so a store that hangs costs a request nothing. Mooncake keeps
values in its clients' segments, wherever its master allocates them: an encoder lends the store
``segment_bytes`` of its memory, or none (0) when the deployment's segment holder
(``holder.py``) lends it all, so that values outlive encoder restarts. Reads and writes go
through a local buffer of ``buffer_bytes``, which bounds a value's size. The client and its
settings: ``client.py``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from epd.server.encode.cache import CachedEmbedding
from epd.server.store.base import MOONCAKE, EmbeddingStore, Lookup, Publish
from epd.server.store.client import (
    CLOSE_WAIT_S,
    Client,
    MooncakeSettings,
    join,
    new_client,
)
from epd.server.store.codec import CorruptValue, decode_value, encode_value, store_key

NUM_READERS = 2
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
logger = logging.getLogger(__name__)


class MooncakeStore(EmbeddingStore):
    """Embeddings in a Mooncake Store; connects in the background from construction on."""

    name = MOONCAKE
    is_enabled = True

    def __init__(
        self, settings: MooncakeSettings, open_client: Callable[[], Client] = new_client
    ) -> None:
        """``open_client`` makes the client (called here, in this thread, so that a missing
        Mooncake is a ValueError at once)."""
        super().__init__()
        self.settings = settings
        self._unconnected: Client | None = open_client()
        self._client: Client | None = None
        self._queue: queue.Queue[tuple[str, CachedEmbedding] | None] = queue.Queue(
            settings.max_queued
        )
        self._readers = ThreadPoolExecutor(NUM_READERS, thread_name_prefix="epd-store-read")
        self._free_readers = threading.BoundedSemaphore(NUM_READERS)
        self._closed = threading.Event()
        self._connected = threading.Event()
        self._writer = threading.Thread(
            target=self._write_loop, name="epd-store-write", daemon=True
        )
        self._writer.start()

    @property
    def is_connected(self) -> bool:
        return self._connected.is_set() and not self._closed.is_set()

    async def wait_connected(self, timeout_s: float) -> bool:
        """Whether the client joined the store within ``timeout_s``."""
        return await asyncio.to_thread(self._connected.wait, timeout_s)

    @property
    def num_queued(self) -> int:
        return self._queue.qsize()

    async def lookup(self, mm_hash: str) -> CachedEmbedding | None:
        outcome, entry = await self._lookup(mm_hash)
        self.counts.count_lookup(outcome)
        return entry

    def publish(self, mm_hash: str, entry: CachedEmbedding) -> None:
        if not self.is_connected:
            self.counts.count_publish(Publish.UNAVAILABLE)
            return
        try:
            self._queue.put_nowait((mm_hash, entry))
        except queue.Full:
            self.counts.count_publish(Publish.DROPPED)

    async def close(self) -> None:
        self._closed.set()
        self._drop_queued()
        self._queue.put_nowait(None)
        await asyncio.to_thread(self._writer.join, CLOSE_WAIT_S)
        self._readers.shutdown(wait=False, cancel_futures=True)

    async def _lookup(self, mm_hash: str) -> tuple[Lookup, CachedEmbedding | None]:
        client = self._client
        if client is None or not self.is_connected or not self._free_readers.acquire(False):
            return Lookup.UNAVAILABLE, None
        try:
            future = self._readers.submit(read, client, mm_hash, self.settings.buffer_bytes)
        except RuntimeError:  # NOTE: closed meanwhile
            self._free_readers.release()
            return Lookup.UNAVAILABLE, None
        future.add_done_callback(lambda _: self._free_readers.release())
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.settings.timeout_s)
        except TimeoutError:
            return Lookup.TIMEOUT, None

    def _write_loop(self) -> None:
        """The writer thread: join the store, then write what is published until closed."""
        client = self._join()
        while client is not None and (item := self._queue.get()) is not None:
            outcome = write(client, *item, self.settings.buffer_bytes)
            if outcome is Publish.STORED:
                self.on_stored(item[0])
            self.counts.count_publish(outcome)
        self._unconnected = self._client = None
        if client is not None:
            client.close()

    def _join(self) -> Client | None:
        """The set-up client, once it joined; None once closed first."""
        client = self._unconnected
        if client is None or not join(client, self.settings, self._closed):
            return None
        self._client = client
        self._connected.set()
        return client

    def _drop_queued(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return


def read(client: Client, mm_hash: str, max_bytes: int) -> tuple[Lookup, CachedEmbedding | None]:
    """Look ``mm_hash`` up through ``client`` (blocking) and check what it holds."""
    key = store_key(mm_hash)
    size = client.get_size(key)
    if size == OBJECT_NOT_FOUND:
        return Lookup.MISS, None
    if size < 0:
        logger.debug("embedding store: get_size(%s) failed (%d)", key, size)
        return Lookup.ERROR, None
    if size > max_bytes:
        logger.warning("embedding store: %s holds %d bytes, over the buffer", key, size)
        return Lookup.CORRUPT, None
    data = client.get(key)
    if not data:
        return Lookup.MISS, None
    try:
        return Lookup.HIT, decode_value(mm_hash, data)
    except CorruptValue as e:
        logger.warning("embedding store: %s refused: %s", key, e)
        return Lookup.CORRUPT, None


def write(client: Client, mm_hash: str, entry: CachedEmbedding, max_bytes: int) -> Publish:
    """Store ``entry`` as ``mm_hash``'s embeddings through ``client`` (blocking)."""
    try:
        value = encode_value(mm_hash, entry)
    except ValueError as e:
        logger.warning("embedding store: not storing %s: %s", mm_hash, e)
        return Publish.ERROR
    if len(value) > max_bytes:
        return Publish.ERROR
    status = client.put(store_key(mm_hash), value)
    if status in (0, OBJECT_ALREADY_EXISTS):
        return Publish.STORED
    logger.debug("embedding store: put of %s failed (%d)", mm_hash, status)
    return Publish.ERROR
