"""Lease bookkeeping shared by producers: who holds what until when (no I/O, injectable clock)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from epd.v1 import tensor_pb2

Payload = TypeVar("Payload")
Clock = Callable[[], float]
# seconds a producer keeps a payload its consumer has not released (a consumer that died)
DEFAULT_LEASE_TTL_S = 60.0


class LeaseInfo(NamedTuple):
    """One payload still held by a producer.

    NOTE: a NamedTuple, not a frozen dataclass: one is made per ``put``, and a frozen dataclass
    costs more to build (its ``__init__`` goes through ``object.__setattr__``)."""

    lease_id: str
    kind: str
    byte_size: int
    location: str
    expires_at: float


_IDS_PER_DRAW = 256
_ids: list[str] = []
# NOTE: a forked child must not hand out the ids its parent drew.
os.register_at_fork(after_in_child=_ids.clear)


def new_lease_id() -> str:
    """128 random bits as 32 hex digits (like ``uuid4().hex``, from ``os.urandom``), drawn
    ``_IDS_PER_DRAW`` at a time (one ``getrandom`` call per id is slow in a process just woken by
    a request). Thread-safe: ``list.pop`` and ``list.extend`` are atomic under the GIL."""
    while True:
        try:
            return _ids.pop()
        except IndexError:
            digits = os.urandom(16 * _IDS_PER_DRAW).hex()
            _ids.extend(digits[i : i + 32] for i in range(0, len(digits), 32))


@dataclass(slots=True)
class _Entry(Generic[Payload]):
    info: LeaseInfo
    payload: Payload


class LeaseTable(Generic[Payload]):
    """Thread-safe map of lease id -> payload with expiry times on ``clock`` (seconds)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry[Payload]] = {}
        self._lock = threading.Lock()

    def add(
        self, payload: Payload, *, kind: str, byte_size: int, location: str, ttl_s: float
    ) -> LeaseInfo:
        """Hold ``payload`` under a new lease that expires ``ttl_s`` from now."""
        info = LeaseInfo(new_lease_id(), kind, byte_size, location, self._clock() + ttl_s)
        with self._lock:
            self._entries[info.lease_id] = _Entry(info, payload)
        return info

    def pop(self, lease_id: str) -> Payload | None:
        """Remove and return the payload of ``lease_id``; None if unknown or already gone."""
        with self._lock:
            entry = self._entries.pop(lease_id, None)
        return None if entry is None else entry.payload

    def pop_expired(self) -> list[Payload]:
        """Remove and return every payload whose lease has expired."""
        now = self._clock()
        with self._lock:
            expired = [key for key, e in self._entries.items() if e.info.expires_at <= now]
            return [self._entries.pop(key).payload for key in expired]

    def pop_all(self) -> list[Payload]:
        """Remove and return every payload (shutdown)."""
        with self._lock:
            payloads = [entry.payload for entry in self._entries.values()]
            self._entries.clear()
        return payloads

    def held(self) -> list[LeaseInfo]:
        """The leases still held, oldest expiry first."""
        with self._lock:
            infos = [entry.info for entry in self._entries.values()]
        return sorted(infos, key=lambda info: info.expires_at)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def attach_lease(
    ref: tensor_pb2.TensorRef, info: LeaseInfo, host_id: str, producer_endpoint: str
) -> tensor_pb2.TensorRef:
    """Fill the holder-facing fields of ``ref`` (host, lease, expiry, where to release)."""
    ref.host_id = host_id
    ref.lease_id = info.lease_id
    ref.lease_expire_time_ms = int(info.expires_at * 1000)
    ref.producer_endpoint = producer_endpoint
    return ref
