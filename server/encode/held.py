"""The encoder's held-item journal: what its cache took and evicted, and what it wrote to the
embedding store, since its last report to the scheduler (``HeldReport``, sent with each
heartbeat as ``epd.v1.HeldItems``).

The scheduler places an item on the encoder holding it (no tower time) from these reports. A
report that may have been lost (a heartbeat failed) or that the scheduler cannot have (the
encoder registered again, e.g. after the scheduler restarted) is made good by a snapshot of the
whole cache in the next one (``resync``); so is a window with more changes than ``max_changes``,
and every ``snapshot_every``-th report is one anyway, so whatever the scheduler believes wrongly
(an item it assumed cached that the cache did not keep) lasts a bounded time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from epd.scheduler.model import HeldReport

# The most items one snapshot names (the cache's most recently used ones).
MAX_SNAPSHOT_ITEMS = 4096


class HeldItemsJournal:
    """Thread-safe: the cache records from the event loop, the store from its writer thread.

    ``snapshot`` lists what the cache holds now, most recently used first; it is called without
    the journal's lock held."""

    def __init__(
        self,
        snapshot: Callable[[int], list[str]],
        max_changes: int = 4096,
        snapshot_every: int = 10,
    ) -> None:
        self._snapshot = snapshot
        self.max_changes = max_changes
        self.snapshot_every = snapshot_every
        self._num_takes = 0
        self._lock = threading.Lock()
        self._held: dict[str, bool] = {}  # mm_hash -> held (True) or evicted (False) last
        self._stored: dict[str, None] = {}
        self._needs_snapshot = True
        self.num_snapshots = 0

    def record(self, mm_hash: str, is_held: bool) -> None:
        """The cache took (``is_held``) or evicted ``mm_hash``."""
        with self._lock:
            if self._needs_snapshot:
                return
            self._held.pop(mm_hash, None)
            self._held[mm_hash] = is_held
            if len(self._held) > self.max_changes:
                self._held.clear()
                self._needs_snapshot = True

    def stored(self, mm_hash: str) -> None:
        """``mm_hash`` was written to the embedding store."""
        with self._lock:
            if len(self._stored) < self.max_changes:
                self._stored[mm_hash] = None

    def resync(self) -> None:
        """The scheduler may have missed a report: the next one is a snapshot."""
        with self._lock:
            self._needs_snapshot = True

    def take(self) -> HeldReport | None:
        """What changed since the previous ``take`` (a snapshot when one is due), cleared here;
        None when nothing did."""
        with self._lock:
            held, self._held = self._held, {}
            stored, self._stored = tuple(self._stored), {}
            is_snapshot, self._needs_snapshot = self._needs_snapshot, False
            self._num_takes += 1
            is_snapshot = is_snapshot or self._num_takes % self.snapshot_every == 0
        if is_snapshot:
            self.num_snapshots += 1
            return HeldReport(True, tuple(self._snapshot(MAX_SNAPSHOT_ITEMS)), (), stored)
        if not held and not stored:
            return None
        added = tuple(h for h, is_held in held.items() if is_held)
        evicted = tuple(h for h, is_held in held.items() if not is_held)
        return HeldReport(False, added, evicted, stored)
