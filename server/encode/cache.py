"""Encoder cache: embeddings by mm_hash, least recently used evicted past a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from epd.server.encode.held import HeldItemsJournal

Grid = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class CachedEmbedding:
    """Embeddings of one image and its grid."""

    embeddings: torch.Tensor
    grid: Grid


class EmbeddingCache:
    """Thread-safe LRU with a byte budget (0 disables caching), holding ``num_bytes`` of
    embeddings; ``journal`` tells the encoder's heartbeats what it took and evicted."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("cache budget must not be negative")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, CachedEmbedding] = OrderedDict()
        self.num_bytes = 0
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0
        self.num_evictions = 0
        self.journal = HeldItemsJournal(self.hashes)

    def get(self, mm_hash: str, *, count_miss: bool = True) -> CachedEmbedding | None:
        """The entry of ``mm_hash`` (counted as a hit, or a miss with ``count_miss``)."""
        with self._lock:
            entry = self._entries.get(mm_hash)
            if entry is None:
                if count_miss:
                    self.num_misses += 1
                return None
            self._entries.move_to_end(mm_hash)
            self.num_hits += 1
            return entry

    def put(self, mm_hash: str, entry: CachedEmbedding) -> None:
        """Insert, evicting the least recently used past the budget; too-large entries skip."""
        if entry.embeddings.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(mm_hash, None)
            self.num_bytes -= old.embeddings.nbytes if old else 0
            self._entries[mm_hash] = entry
            self.num_bytes += entry.embeddings.nbytes
            while self.num_bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.num_bytes -= evicted.embeddings.nbytes
                self.num_evictions += 1

    def hashes(self, limit: int = 1024) -> list[str]:
        """Up to ``limit`` most recently used hashes, most recent first."""
        with self._lock:
            return list(reversed(self._entries))[:limit]

    def __len__(self) -> int:
        return len(self._entries)
