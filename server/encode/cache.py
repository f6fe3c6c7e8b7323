"""Encoder cache: embeddings by mm_hash, least recently used evicted past a byte budget."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import torch

from epd.server.encode.held import HeldItemsJournal
from epd.server.media.cache import AsyncLruCache

Grid = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class CachedEmbedding:
    """Embeddings of one image, its grid and the number of images in the tower's batch that
    made them (0: made elsewhere, e.g. read from the embedding store)."""

    embeddings: torch.Tensor
    grid: Grid
    batch_size: int = 0


class EmbeddingCache(AsyncLruCache[CachedEmbedding]):
    """The media cache (``AsyncLruCache``: one encoding of an image shared by concurrent
    requests) under a byte budget of embeddings (0 disables caching), with no limit on their
    number; ``journal`` tells the encoder's heartbeats what it took and evicted."""

    max_bytes: int

    def __init__(self, max_bytes: int) -> None:
        super().__init__(None, max_bytes=max_bytes, size_of=attrgetter("embeddings.nbytes"))
        self.journal = HeldItemsJournal(self.keys)
