"""Multimodal-aware KV routing: which prefill worker already holds the longest prompt prefix.

The route hashes the expanded prompt in fixed-size blocks, chaining each block's hash with the
previous one and replacing each image's placeholder tokens by a pad value derived from its
mm_hash, so two prompts share a block hash only if they share the whole prefix up to it, images
included. The index remembers, per worker, the block hashes it routed there (and any KV events the
worker reports); because hashes chain, the overlap is the number of leading blocks found.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class PrefixIndex:
    """Per-worker sets of block hashes, each bounded LRU (``max_blocks_per_worker``)."""

    def __init__(self, max_blocks_per_worker: int = 100_000) -> None:
        self._max = max_blocks_per_worker
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    def overlap(self, worker_id: str, block_hashes: Sequence[int]) -> int:
        """Leading blocks of ``block_hashes`` that ``worker_id`` holds."""
        held = self._blocks.get(worker_id)
        if not held:
            return 0
        count = 0
        for block in block_hashes:
            if block not in held:
                break
            count += 1
        return count

    def store(self, worker_id: str, block_hashes: Iterable[int]) -> None:
        """Record blocks as held by ``worker_id`` (most recent last)."""
        held = self._blocks.setdefault(worker_id, OrderedDict())
        for block in block_hashes:
            held[block] = None
            held.move_to_end(block)
        while len(held) > self._max:
            held.popitem(last=False)

    def remove(self, worker_id: str, block_hashes: Iterable[int]) -> None:
        """Forget blocks the worker evicted."""
        held = self._blocks.get(worker_id)
        if held is not None:
            for block in block_hashes:
                held.pop(block, None)

    def forget(self, worker_id: str) -> None:
        """Drop everything about a worker that left."""
        self._blocks.pop(worker_id, None)

    def num_blocks(self, worker_id: str) -> int:
        """Blocks recorded for ``worker_id``."""
        return len(self._blocks.get(worker_id, ()))
