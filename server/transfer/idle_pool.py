"""Idle memory by size class, kept for reuse within a byte budget.

``IdlePool`` is the reuse behind every pool of the data plane: shm segments, NIXL registered
blocks, and ``WarmBuffers``, memory for large private copies, recycled while its pages are still
mapped.

A consumer's ``get(copy=True)`` hands the caller a tensor of its own. Allocated afresh, a large
one costs more than the copy into it: glibc serves allocations over 32 MiB with a new ``mmap``
every time, and each of its pages faults and is zeroed on first touch, which costs several times
the memcpy itself (docs/transfer.md). Smaller allocations come warm out of glibc's heap after the
first has been freed, so only copies over ``min_bytes`` take a buffer from ``WarmBuffers``.
A buffer is an anonymous mapping of a size class (multiples of an eighth of a power of two, so at
most 12.5% of it is slack). The tensor's storage is a ctypes array over the mapping; when the
last tensor viewing it is collected the mapping comes back idle, up to ``max_idle_bytes`` in all
(beyond that, and after ``close``, it is unmapped).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import weakref
from collections import defaultdict
from typing import Generic, TypeVar

import torch

from epd.server.transfer.tensors import view_bytes

Item = TypeVar("Item")
# the idle budget of a pool of the data plane unless its owner says otherwise
DEFAULT_MAX_IDLE_BYTES = 1 << 30
# private copies from this size up go into recycled buffers
DEFAULT_MIN_BYTES = 32 << 20


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


def buffer_class(num_bytes: int) -> int:
    """Capacity of the buffer for ``num_bytes``: rounded up to an eighth of its power of two."""
    step = max(mmap.PAGESIZE, 1 << max(num_bytes.bit_length() - 4, 0))
    return -(-num_bytes // step) * step


class WarmBuffers:
    """Recycled anonymous mappings for private tensors of ``min_bytes`` or more. Thread-safe."""

    def __init__(
        self, min_bytes: int = DEFAULT_MIN_BYTES, max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES
    ) -> None:
        self.min_bytes = min_bytes
        self._idle: IdlePool[mmap.mmap] = IdlePool(max_idle_bytes)

    def empty(self, dtype: torch.dtype, shape: list[int], byte_size: int) -> torch.Tensor:
        """An uninitialised tensor of ``dtype`` and ``shape`` (``byte_size`` bytes) the caller
        owns: a recycled buffer from ``min_bytes`` up, else ``torch.empty``."""
        if byte_size < self.min_bytes:
            return torch.empty(tuple(shape), dtype=dtype)
        capacity = buffer_class(byte_size)
        buffer = self._idle.take(capacity)
        if buffer is None:
            buffer = mmap.mmap(-1, capacity)
        # NOTE: the array is the object the tensor's storage keeps alive; when the last view dies,
        # the array dies and the finalizer brings the mapping back.
        array = (ctypes.c_char * byte_size).from_buffer(buffer)
        weakref.finalize(array, self._give_back, buffer)
        return view_bytes(array, dtype, shape, byte_size)

    @property
    def idle_bytes(self) -> int:
        """Bytes of the mappings waiting for reuse."""
        return self._idle.idle_bytes

    def close(self) -> None:
        """Unmap idle buffers; buffers still in use are unmapped when their tensors die."""
        for buffer in self._idle.close():
            buffer.close()

    def _give_back(self, buffer: mmap.mmap) -> None:
        if not self._idle.offer(len(buffer), buffer):
            with contextlib.suppress(BufferError):
                buffer.close()
