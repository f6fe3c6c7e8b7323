"""The embedding store on Mooncake Store (``mooncake.store.MooncakeDistributedStore``, TCP).

Every call into Mooncake blocks (after the master died, each takes about 4 s), so none runs on
the event loop: ``setup``, then every publish, run in one daemon writer thread fed by a bounded
queue; lookups run in ``NUM_READERS`` reader threads, each waited
for at most ``timeout_s``. A lookup that finds every reader still busy with a slow call is not
asked (``Lookup.UNAVAILABLE``), so a store that hangs costs a request nothing. The encoder lends
the store ``segment_bytes`` of its memory (Mooncake keeps values in its clients' segments) and
reads and writes through a local buffer of ``buffer_bytes``, which bounds a value's size.

NOTE: ``setup`` holds the GIL, for about 90 s when the master cannot be reached: the writer
calls it only once the master's port and the metadata server's accept a connection.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import threading
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from epd.server.encode.cache import CachedEmbedding
from epd.server.store.base import MOONCAKE, EmbeddingStore, Lookup, Publish
from epd.server.store.codec import CorruptValue, decode_value, encode_value, store_key

NUM_READERS = 2
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
RETRY_CONNECT_S = 2.0
# NOTE: a client's close takes about 12 s once its master died; a process that exits before
# it ends aborts in Mooncake's destructors.
CLOSE_WAIT_S = 30.0
INSTALL_HINT = (
    "--embedding-store mooncake needs Mooncake's Python package (mooncake-transfer-engine-non-cuda "
    "on CPU, -cuda13 on GPUs) and Debian's libibverbs1 and librdmacm1: scripts/install.sh "
    "installs them"
)
logger = logging.getLogger(__name__)


class Client(Protocol):
    """The calls of ``MooncakeDistributedStore`` this store makes (status codes: 0 or a size
    for success, a negative Mooncake ``ErrorCode`` otherwise; ``get`` answers b"" on failure)."""

    def setup(self, *args: Any) -> int: ...
    def get_size(self, key: str) -> int: ...
    def get(self, key: str) -> bytes: ...
    def put(self, key: str, value: bytes) -> int: ...
    def close(self) -> int: ...


@dataclass(frozen=True, slots=True)
class MooncakeSettings:
    """Where the master and its metadata server are, how this client joins (``local_hostname``:
    the address its peers reach it at), how long a lookup may take, the memory it lends and
    buffers, and how many publishes may wait. ValueError for an empty address or a size or
    wait out of range."""

    master: str
    metadata_server: str
    local_hostname: str = "127.0.0.1"
    timeout_s: float = 0.05
    segment_bytes: int = 256 << 20
    buffer_bytes: int = 64 << 20
    max_queued: int = 64

    def __post_init__(self) -> None:
        if not self.master or not self.metadata_server:
            raise ValueError(
                "--embedding-store mooncake needs --store-master HOST:PORT and "
                "--store-metadata-server http://HOST:PORT/metadata"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"store timeout must be positive, got {self.timeout_s}")
        if min(self.segment_bytes, self.buffer_bytes, self.max_queued) < 1:
            raise ValueError("store segment, buffer and queue sizes must be at least 1")


def new_client() -> Client:
    """A Mooncake client, not set up; ValueError saying how to install Mooncake when it cannot
    be loaded."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise ValueError(f"{INSTALL_HINT} ({e})") from e
    client: Client = MooncakeDistributedStore()
    return client


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
        """The set-up client, retried every ``RETRY_CONNECT_S`` until it joins; None once
        closed."""
        client, settings = self._unconnected, self.settings
        while client is not None and not self._closed.is_set():
            if not is_reachable(settings):
                self._closed.wait(RETRY_CONNECT_S)
                continue
            status = client.setup(
                settings.local_hostname,
                settings.metadata_server,
                settings.segment_bytes,
                settings.buffer_bytes,
                "tcp",
                "",
                settings.master,
            )
            if status == 0:
                self._client = client
                self._connected.set()
                logger.info("joined the embedding store at %s", settings.master)
                return client
            logger.warning("embedding store at %s: setup failed (%d)", settings.master, status)
            self._closed.wait(RETRY_CONNECT_S)
        return None

    def _drop_queued(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return


def is_reachable(settings: MooncakeSettings) -> bool:
    """Whether the master's port and the metadata server's both accept a connection now."""
    metadata = urllib.parse.urlsplit(settings.metadata_server)
    master = urllib.parse.urlsplit(f"//{settings.master}")
    for host, port in ((master.hostname, master.port), (metadata.hostname, metadata.port)):
        try:
            with socket.create_connection((host or "", port or 80), timeout=1.0):
                pass
        except (OSError, ValueError):
            return False
    return True


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
