"""A consumer's mappings of producers' shared-memory segments, kept from one read to the next.

Producers reuse pooled segments, so a consumer reads the same few segments again and again.
Mapping one afresh for every read costs the open, fstat, mmap and munmap and, above all, the
page-table entries of every page the reader touches: copying out of a fresh mapping is several
times slower than out of a kept one, which copies at memcpy speed (docs/transfer.md).

Two kinds of cache, one per use:
- shared (read-only ``MAP_SHARED``) mappings, which the consumer copies out of (``copy=True``):
  they always show the segment's bytes, and no caller ever sees them;
- private (copy-on-write) mappings, which callers get views of (``copy=False``): a caller that
  writes to its view never changes the producer's segment. Before a kept private mapping serves
  the next lease of its segment, ``madvise(MADV_DONTNEED)`` drops the pages callers wrote to (and
  with them every page-table entry), and the mapping shows the segment's bytes again. That is sound
  because the producer reuses a segment only after the lease it held was released, and a view is
  valid only until then. The mapping is reset only once the segment's header (read from the
  file: a caller's writes may have copied the mapping's first page) names the new lease, so a
  stale reference never resets the views of a live one. A second read of the lease a private
  mapping last served gets a mapping of its own, so two holders of one lease never see each
  other's writes.

A mapping of a segment that its producer unlinked would pin the segment's memory: hits check the
link count, and ``trim`` (the data plane's reaper calls it once a second) forgets such mappings.
Pages a caller wrote to are this process's own memory until the mapping is reset: ``trim`` also
resets private mappings whose view has died.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_MAPPINGS = 64


@dataclass(slots=True)
class Mapping:
    """A mapping of a whole segment, with the file descriptor it was made from, the lease it
    last served and a weak reference to the view of it handed to a caller since its last reset
    (one at most: a second read of a lease gets a mapping of its own)."""

    fd: int
    buffer: mmap.mmap
    lease_id: str
    lent: weakref.ref[memoryview] | None = None

    @property
    def size(self) -> int:
        """Bytes mapped: the whole segment."""
        return len(self.buffer)

    def reset(self) -> None:
        """Drop every page of the mapping (pages callers wrote to included): it shows the
        segment's bytes again."""
        self.buffer.madvise(mmap.MADV_DONTNEED)
        self.lent = None

    def close(self) -> None:
        os.close(self.fd)
        # NOTE: BufferError means a caller still holds a view; the mapping goes with the last one.
        with contextlib.suppress(BufferError):
            self.buffer.close()


class MappingCache:
    """Up to ``max_mappings`` mappings of at most ``max_bytes`` in all, least recently used
    first out; ``private`` ones are reset for each new lease (see the module docstring).
    Thread-safe."""

    def __init__(
        self,
        *,
        private: bool,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_mappings: int = DEFAULT_MAX_MAPPINGS,
    ) -> None:
        self.private = private
        self.max_bytes = max_bytes
        self.max_mappings = max_mappings
        self._mappings: OrderedDict[str, Mapping] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def kept_view(self, name: str, lease_id: str, header: bytes) -> memoryview | None:
        """A view of the whole kept mapping of segment ``name`` for ``lease_id``; None where none
        is kept, where the segment was unlinked (then it is forgotten) or, for a private mapping,
        where it last served ``lease_id`` (that view may have been written to) or where the
        segment does not start with ``header`` (``lease_id``'s stamp): a stale reference must
        never reset a mapping whose views still serve a live lease."""
        with self._lock:
            mapping = self._mappings.get(name)
            if mapping is None:
                return None
            if os.fstat(mapping.fd).st_nlink == 0:
                self._forget(name)
                return None
            if self.private:
                if mapping.lease_id == lease_id or os.pread(mapping.fd, len(header), 0) != header:
                    return None
                mapping.reset()
            mapping.lease_id = lease_id
            self._mappings.move_to_end(name)
            # NOTE: the view is made under the lock: an export keeps an eviction from closing it.
            return memoryview(mapping.buffer)

    def keep(self, name: str, mapping: Mapping) -> bool:
        """Keep ``mapping`` of segment ``name``; False where it is not kept (one is kept for the
        segment already, or it is larger than the cache): then the caller closes its fd."""
        with self._lock:
            if name in self._mappings or mapping.size > self.max_bytes or not self.max_mappings:
                return False
            self._mappings[name] = mapping
            self._bytes += mapping.size
            while self._bytes > self.max_bytes or len(self._mappings) > self.max_mappings:
                self._forget(next(iter(self._mappings)))
            return True

    def lend(self, name: str, view: memoryview) -> None:
        """Note that ``view`` (a part of the kept mapping of ``name``) was handed to a caller, so
        that ``trim`` resets the mapping once the view is gone."""
        with self._lock:
            mapping = self._mappings.get(name)
            if self.private and mapping is not None and view.obj is mapping.buffer:
                mapping.lent = weakref.ref(view)

    def trim(self) -> int:
        """Forget mappings of segments their producer unlinked (they pin its memory) and reset
        private ones whose view has died (pages a caller wrote to are private memory of this
        process until then); returns how many were forgotten."""
        with self._lock:
            gone = [
                name
                for name, mapping in self._mappings.items()
                if os.fstat(mapping.fd).st_nlink == 0
            ]
            for name in gone:
                self._forget(name)
            for mapping in self._mappings.values():
                if mapping.lent is not None and mapping.lent() is None:
                    mapping.reset()
            return len(gone)

    def clear(self) -> None:
        """Forget every mapping."""
        with self._lock:
            for name in list(self._mappings):
                self._forget(name)

    def __len__(self) -> int:
        return len(self._mappings)

    @property
    def num_bytes(self) -> int:
        """Bytes of the mappings kept."""
        return self._bytes

    def _forget(self, name: str) -> None:
        mapping = self._mappings.pop(name)
        self._bytes -= mapping.size
        mapping.close()
