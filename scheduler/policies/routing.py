"""Multimodal-aware KV routing: which prefill worker already holds the longest prompt prefix.

The route hashes the expanded prompt in fixed-size blocks, chaining each block's hash with the
previous one and replacing each image's placeholder tokens by a pad value derived from its
mm_hash, so two prompts share a block hash only if they share the whole prefix up to it, images
included (and the tenant's salt, mixed into the first block). The index remembers, per worker,
the block hashes it routed there (and any KV events the worker reports); because hashes chain,
the overlap is the number of leading blocks found. It cannot see what an engine evicted: each
worker's memory is a bounded LRU, as the engine's own cache is, and a wrong guess costs one
prefill recomputed, never a wrong answer.

``PrefillChooser`` turns overlaps and loads into a choice (``cache_aware``, the load balancing
SGLang's router does around its prefix trees; ``longest_prefix``, any overlap first), or ignores
both (``round_robin``, the baseline).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

CACHE_AWARE = "cache_aware"
LONGEST_PREFIX = "longest_prefix"
ROUND_ROBIN = "round_robin"
PREFILL_POLICIES = (CACHE_AWARE, LONGEST_PREFIX, ROUND_ROBIN)


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


class HasId(Protocol):
    """A worker as the chooser sees it: its id."""

    @property
    def id(self) -> str: ...


Worker = TypeVar("Worker", bound=HasId)


class PrefillChooser:
    """Chooses the prefill worker of each prompt and remembers the blocks it sent where.

    ``cache_aware``: the worker holding the longest prefix of the prompt, when it holds at
    least ``cache_threshold`` of its blocks and its load exceeds the least-loaded worker's by at
    most ``balance_threshold`` (in requests per unit of capacity: waiting behind more than that
    costs more than computing the prefix again); otherwise the least-loaded worker, and among
    equally loaded ones the one remembered to hold the fewest blocks (the most room: SGLang's
    router sends such a prompt to its smallest prefix tree), then the first by id.
    ``longest_prefix``: the longest overlap whatever the loads, ties and misses by load, then
    id (the choice before ``cache_aware``). ``round_robin``: each worker in turn by id, whatever
    it holds or runs.
    """

    def __init__(
        self,
        policy: str = CACHE_AWARE,
        *,
        cache_threshold: float = 0.5,
        balance_threshold: float = 0.5,
        max_blocks_per_worker: int = 100_000,
    ) -> None:
        """ValueError for an unknown policy or a threshold out of range."""
        if policy not in PREFILL_POLICIES:
            raise ValueError(
                f"prefill policy {policy!r}: choose from {', '.join(PREFILL_POLICIES)}"
            )
        if not 0 < cache_threshold <= 1 or balance_threshold < 0:
            raise ValueError("cache_threshold must be in (0, 1], balance_threshold >= 0")
        self.policy = policy
        self.cache_threshold = cache_threshold
        self.balance_threshold = balance_threshold
        self.index = PrefixIndex(max_blocks_per_worker)
        self._turn = 0

    def choose(
        self,
        workers: Sequence[Worker],
        block_hashes: Sequence[int],
        busy: Callable[[Worker], float],
    ) -> tuple[Worker, int]:
        """The worker for a prompt of ``block_hashes`` among ``workers`` (not empty), and the
        number of its leading blocks that worker holds; its blocks are then recorded there.
        ``busy``: a worker's requests in flight and queued per unit of its capacity."""
        ordered = sorted(workers, key=lambda worker: worker.id)
        overlaps = [self.index.overlap(worker.id, block_hashes) for worker in ordered]
        if self.policy == ROUND_ROBIN:
            best = self._turn % len(ordered)
            self._turn += 1
        else:
            loads = [busy(worker) for worker in ordered]
            best = max(range(len(ordered)), key=lambda i: (overlaps[i], -loads[i]))
            is_held = 0 < overlaps[best] >= self.cache_threshold * len(block_hashes)
            is_balanced = loads[best] - min(loads) <= self.balance_threshold
            if self.policy == CACHE_AWARE and not (is_held and is_balanced):
                # NOTE: the least loaded, then the emptiest: where a new prefix has room
                best = min(
                    range(len(ordered)),
                    key=lambda i: (loads[i], self.index.num_blocks(ordered[i].id)),
                )
        self.index.store(ordered[best].id, block_hashes)
        return ordered[best], overlaps[best]
