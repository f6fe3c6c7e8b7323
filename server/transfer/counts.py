"""What a data plane has moved and lost, by backend: counters read by its metrics."""

from __future__ import annotations

import threading
from collections import Counter


class TransferCounts:
    """Bytes put and read and leases that expired unreleased, by transfer kind. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes_put: Counter[str] = Counter()
        self._bytes_read: Counter[str] = Counter()
        self._expired: Counter[str] = Counter()

    def add_put(self, kind: str, num_bytes: int) -> None:
        """A producer of ``kind`` took ``num_bytes``."""
        with self._lock:
            self._bytes_put[kind] += num_bytes

    def add_read(self, kind: str, num_bytes: int) -> None:
        """A consumer of ``kind`` read ``num_bytes``."""
        with self._lock:
            self._bytes_read[kind] += num_bytes

    def add_expired(self, kind: str, num_leases: int) -> None:
        """The reaper freed ``num_leases`` leases of ``kind`` that nobody released (a leak)."""
        if num_leases:
            with self._lock:
                self._expired[kind] += num_leases

    def bytes_put(self) -> dict[str, int]:
        """Bytes put so far, by kind."""
        with self._lock:
            return dict(self._bytes_put)

    def bytes_read(self) -> dict[str, int]:
        """Bytes read so far, by kind."""
        with self._lock:
            return dict(self._bytes_read)

    def expired(self) -> dict[str, int]:
        """Leases freed by expiry so far, by kind."""
        with self._lock:
            return dict(self._expired)
