"""The embedding store's interface, its outcome counts, and the store of none.

An encoder calls ``lookup`` after a miss in its own cache, before encoding, and ``publish`` after
encoding. Neither may fail or delay a request: a store that is down, full, slow or holds garbage
answers ``lookup`` with None and drops a publish, and the outcome is counted (``StoreCounts``,
exported as the encoder's metrics).
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable

from epd.server.encode.cache import CachedEmbedding

NONE = "none"
MOONCAKE = "mooncake"
EMBEDDING_STORES = (NONE, MOONCAKE)


class Lookup(enum.Enum):
    """What one lookup found: ``HIT`` (the embeddings, checked), ``MISS`` (the store holds no
    value for the key), ``CORRUPT`` (a value failed its checks), ``ERROR`` (the store answered
    with an error), ``TIMEOUT`` (no answer in time), ``UNAVAILABLE`` (not asked: not connected
    yet, or every reader still waits on a slow call)."""

    HIT = "hit"
    MISS = "miss"
    CORRUPT = "corrupt"
    ERROR = "error"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"


class Publish(enum.Enum):
    """What became of one publish: ``STORED``, ``DROPPED`` (the queue was full),
    ``ERROR`` (the store refused it or failed, full included), ``UNAVAILABLE`` (not connected)."""

    STORED = "stored"
    DROPPED = "dropped"
    ERROR = "error"
    UNAVAILABLE = "unavailable"


class StoreCounts:
    """Thread-safe counts of lookups and publishes by outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lookups: Counter[Lookup] = Counter()
        self.publishes: Counter[Publish] = Counter()

    def count_lookup(self, outcome: Lookup) -> None:
        with self._lock:
            self.lookups[outcome] += 1

    def count_publish(self, outcome: Publish) -> None:
        with self._lock:
            self.publishes[outcome] += 1


class EmbeddingStore(ABC):
    """Embeddings by mm_hash, shared by every encoder of a deployment.

    ``lookup`` and ``publish`` are called on the encoder's event loop and never raise; the store
    copies what it publishes, so the caller keeps its tensor. ``close`` is called once, when
    the encoder stops; calls after it find the store unavailable. ``on_stored(mm_hash)`` is
    called (from any thread) once a publish is stored; the encoder tells the scheduler."""

    name: str = NONE
    is_enabled: bool = False

    def __init__(self) -> None:
        self.counts = StoreCounts()
        self.on_stored: Callable[[str], None] = lambda mm_hash: None

    @abstractmethod
    async def lookup(self, mm_hash: str) -> CachedEmbedding | None:
        """The embeddings of ``mm_hash`` held in the store (host memory), or None (a miss, or
        the store failed: counted either way)."""

    @abstractmethod
    def publish(self, mm_hash: str, entry: CachedEmbedding) -> None:
        """Queue ``entry`` to be stored as ``mm_hash``'s embeddings; returns at once (dropped
        and counted when the queue is full)."""

    @property
    def num_queued(self) -> int:
        """Publishes waiting to be written."""
        return 0

    async def close(self) -> None:
        """Stop publishing and disconnect (what is queued is dropped); may take seconds when
        the store is gone."""
        return None


class NoStore(EmbeddingStore):
    """No store: every lookup misses uncounted, every publish is ignored (each encoder's own
    cache only)."""

    async def lookup(self, mm_hash: str) -> CachedEmbedding | None:
        return None

    def publish(self, mm_hash: str, entry: CachedEmbedding) -> None:
        return None
