"""Idle buffers by size class, within a byte budget: the reuse behind every pool of the data plane
(shm segments, NIXL registered blocks, buffers for large private copies)."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Generic, TypeVar

Item = TypeVar("Item")
# the idle budget of a pool of the data plane unless its owner says otherwise
DEFAULT_MAX_IDLE_BYTES = 1 << 30


class IdlePool(Generic[Item]):
    """Items waiting for reuse, by capacity, at most ``max_idle_bytes`` of capacity in all.
    Thread-safe. The pool never frees an item: what it refuses or gives up, its owner frees."""

    def __init__(self, max_idle_bytes: int) -> None:
        self.max_idle_bytes = max_idle_bytes
        self._idle: dict[int, list[Item]] = defaultdict(list)
        self._idle_bytes = 0
        self._is_closed = False
        self._lock = threading.Lock()

    def take(self, capacity: int) -> Item | None:
        """An idle item of ``capacity`` (the one put last), or None."""
        with self._lock:
            idle = self._idle.get(capacity)
            if not idle:
                return None
            self._idle_bytes -= capacity
            return idle.pop()

    def offer(self, capacity: int, item: Item) -> bool:
        """Keep ``item`` for reuse; False (the owner frees it) once closed or over budget."""
        with self._lock:
            if self._is_closed or self._idle_bytes + capacity > self.max_idle_bytes:
                return False
            self._idle[capacity].append(item)
            self._idle_bytes += capacity
            return True

    def close(self) -> list[Item]:
        """Refuse every later offer; returns the idle items, for the owner to free."""
        with self._lock:
            self._is_closed = True
            idle = [item for items in self._idle.values() for item in items]
            self._idle.clear()
            self._idle_bytes = 0
        return idle

    @property
    def idle_bytes(self) -> int:
        """Capacity of the items waiting for reuse."""
        return self._idle_bytes
