"""The encoder's held-item journal: what its cache took and evicted, and what it wrote to the
embedding store, since its last report to the scheduler (``HeldReport``, sent with each
heartbeat as ``epd.v1.HeldItems``).

The changes are the difference between what the cache holds at each report and what the
previous report said (its ``max_items`` most recently used entries), so nothing runs on a
request's path and nothing is lost between two reports. A report that may itself have been lost
(a heartbeat failed) or that the scheduler cannot have (the encoder registered again, e.g. after
the scheduler restarted) is made good by a snapshot of the cache in the next one (``resync``),
and every ``snapshot_every``-th report is a snapshot anyway, so what the scheduler assumed
wrongly (an item it believed cached that the cache did not keep) lasts a bounded time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from epd.common.held_items import HeldReport

# The most items a report names as held (the cache's most recently used ones).
MAX_REPORTED_ITEMS = 4096


class HeldItemsJournal:
    """``held(limit)`` lists what the cache holds now, most recently used first. ``take`` is
    called from one thread (the heartbeat's); ``stored`` and ``resync`` from any."""

    def __init__(
        self,
        held: Callable[[int], list[str]],
        max_items: int = MAX_REPORTED_ITEMS,
        snapshot_every: int = 10,
    ) -> None:
        self._held = held
        self.max_items = max_items
        self.snapshot_every = snapshot_every
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        self._stored: dict[str, None] = {}
        self._needs_snapshot = True
        self._num_takes = 0

    def stored(self, mm_hash: str) -> None:
        """``mm_hash`` was written to the embedding store."""
        with self._lock:
            if len(self._stored) < self.max_items:
                self._stored[mm_hash] = None

    def resync(self) -> None:
        """The scheduler may have missed a report: the next one is a snapshot."""
        with self._lock:
            self._needs_snapshot = True

    def take(self) -> HeldReport | None:
        """What changed since the previous ``take`` (a snapshot when one is due); None when
        nothing did."""
        with self._lock:
            stored, self._stored = tuple(self._stored), {}
            is_snapshot, self._needs_snapshot = self._needs_snapshot, False
            self._num_takes += 1
            is_snapshot = is_snapshot or self._num_takes % self.snapshot_every == 0
        held = self._held(self.max_items)
        previous, self._reported = self._reported, set(held)
        if is_snapshot:
            return HeldReport(True, tuple(held), (), stored)
        added = tuple(h for h in held if h not in previous)
        evicted = tuple(sorted(previous - self._reported))
        if not (added or evicted or stored):
            return None
        return HeldReport(False, added, evicted, stored)
