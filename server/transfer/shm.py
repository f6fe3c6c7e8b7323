"""The shared-memory backend: POSIX segments in /dev/shm, pooled, read zero-copy.

Segments are files under /dev/shm created 0600 with a per-process prefix
``epd-<pid>-<process start time>-``, so producers (at start and from their reaper) and the
launcher can tell leftovers of dead processes (or of an earlier process that had the same pid)
from live ones and unlink them (``shm_orphans``). Segments are
mapped with plain ``mmap`` (not ``multiprocessing.shared_memory``), so Python's resource_tracker
never registers, warns about or unlinks them behind our back.

Each segment starts with the 64-byte lease stamp of the payload it carries (``payload_layout``).
A consumer checks it, so a reference whose lease was released (and whose segment was reused for
another tensor) fails with NOT_FOUND instead of returning someone else's data: a copying read
checks it once the payload is copied (a copy returns verified bytes or raises); the reader of a
view checks it after use (``ShmConsumer.check``).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from epd.common.errors import FailedPrecondition, InvalidArgument, NotFound
from epd.server.transfer.base import LeasedProducer, ProducerSettings, TensorConsumer
from epd.server.transfer.idle_pool import IdlePool, WarmBuffers
from epd.server.transfer.payload_layout import (
    HEADER_BYTES,
    LEASE_ID_CHARS,
    LEASE_STAMP_BYTES,
    check_stamp,
    size_class,
    stamp_of,
)
from epd.server.transfer.shm_mappings import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_MAPPINGS,
    Mapping,
    MappingCache,
)
from epd.server.transfer.shm_orphans import (
    NAME,
    SHM_DIR,
    cleanup_orphans,
    process_prefix,
)
from epd.server.transfer.shm_orphans import list_segments as list_segments
from epd.server.transfer.shm_orphans import orphans as orphans
from epd.server.transfer.tensors import check_layout, copy_payload, describe, move, view_bytes
from epd.v1 import tensor_pb2

if TYPE_CHECKING:
    from typing_extensions import Unpack

# NOTE: list_segments and orphans are re-exported above: tests and tools call them as shm.*.

# Payloads up to this size are read into a private copy: a read costs less than mapping.
SMALL_COPY_BYTES = 16 << 10
# NOTE: one counter per process, not per producer: several producers in one process (tests, a
# process serving two roles) must never pick the same segment name.
_SEGMENT_NUMBERS = itertools.count(1)


@dataclass(slots=True)
class Segment:
    """One mapped segment owned by this producer: the lease stamp of the payload it carries
    (``payload_layout``), then the payload."""

    name: str
    capacity: int
    buffer: mmap.mmap
    address: int


class ShmProducer(LeasedProducer[Segment]):
    """Puts tensors into pooled segments under leases; removes dead processes' leftovers.

    Segments are pooled by power-of-two size class and reused after release (creating one per
    transfer is several times slower); idle segments beyond ``max_idle_bytes`` are unlinked."""

    kind = "shm"

    def __init__(
        self,
        host_id: str,
        *,
        shm_dir: str = SHM_DIR,
        **settings: Unpack[ProducerSettings],
    ) -> None:
        super().__init__(host_id, **settings)
        self._dir = shm_dir
        cleanup_orphans(shm_dir)
        self._prefix = process_prefix()
        self._idle: IdlePool[Segment] = IdlePool(self.max_idle_bytes)
        self._lock = threading.Lock()
        self.num_segments = 0
        """Segments created and not yet unlinked: leased, idle, or being filled."""

    def put(
        self, tensor: torch.Tensor, *, ttl_s: float | None = None, content_tag: bytes = b""
    ) -> tensor_pb2.TensorRef:
        """As ``TensorProducer.put``; ``content_tag`` goes into the segment's stamp, where
        ``get(..., content_tag=)`` checks it (``payload_layout``)."""
        ref = describe(tensor)
        capacity = size_class(ref.byte_size)
        segment = self._idle.take(capacity) or self._create(capacity)
        copy_payload(segment.address + HEADER_BYTES, tensor)
        info = self._lease(ref, segment, segment.name, ttl_s)
        segment.buffer[:HEADER_BYTES] = stamp_of(info.lease_id, content_tag)
        ref.shm.CopyFrom(
            tensor_pb2.ShmLocation(name=segment.name, offset=HEADER_BYTES, size=ref.byte_size)
        )
        return ref

    def _free(self, segment: Segment) -> None:
        """Wipe ``segment``'s stamp and keep it for reuse (unlink it if the idle budget is
        full, or once closed)."""
        segment.buffer[:HEADER_BYTES] = bytes(HEADER_BYTES)
        if not self._idle.offer(segment.capacity, segment):
            self._destroy(segment)

    def remove_orphans(self) -> list[str]:
        """Unlink the segments of dead producers on this host (see ``shm_orphans``)."""
        return cleanup_orphans(self._dir)

    def close(self) -> None:
        super().close()
        for segment in self._idle.close():
            self._destroy(segment)

    def _create(self, capacity: int) -> Segment:
        name = f"{self._prefix}{next(_SEGMENT_NUMBERS)}"
        path = os.path.join(self._dir, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, capacity)
            buffer = mmap.mmap(fd, capacity)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        with self._lock:
            self.num_segments += 1
        # NOTE: the ctypes object is dropped at once, so the mapping stays closable.
        return Segment(name, capacity, buffer, ctypes.addressof(ctypes.c_char.from_buffer(buffer)))

    def _destroy(self, segment: Segment) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._dir, segment.name))
        with self._lock:
            self.num_segments -= 1
        # NOTE: BufferError means a local view still exists; the mapping goes when it is collected.
        with contextlib.suppress(BufferError):
            segment.buffer.close()


class ShmConsumer(TensorConsumer):
    """Maps segments of producers on the same host; views payloads without copying, or copies
    them out at memcpy speed (large copies into recycled buffers, see ``idle_pool``).

    Mappings are kept for the next lease of the same segment (see ``shm_mappings``): at most
    ``max_mapped_bytes`` (default 1 GiB; 0 keeps none) in ``max_mappings`` segments, once for
    views and once for copies."""

    kind = "shm"

    def __init__(
        self,
        host_id: str,
        *,
        shm_dir: str = SHM_DIR,
        max_mapped_bytes: int = DEFAULT_MAX_BYTES,
        max_mappings: int = DEFAULT_MAX_MAPPINGS,
    ) -> None:
        self.host_id = host_id
        self._dir = shm_dir
        self.views = MappingCache(
            private=True, max_bytes=max_mapped_bytes, max_mappings=max_mappings
        )
        self.copies = MappingCache(
            private=False, max_bytes=max_mapped_bytes, max_mappings=max_mappings
        )
        self.buffers = WarmBuffers()

    def get(
        self, ref: tensor_pb2.TensorRef, *, copy: bool = False, content_tag: bytes = b""
    ) -> torch.Tensor:
        """As ``TensorConsumer.get``; with ``content_tag``, FailedPrecondition (CONTENT_MISMATCH)
        unless the producer tagged the payload so. A copy (``copy=True``, and every payload up to
        ``SMALL_COPY_BYTES``) is checked after it was copied: it holds the lease's payload or
        the read raises (NotFound LEASE_RELEASED); a view is checked before it is returned."""
        dtype, shape = check_layout(ref)
        location = ref.shm
        if ref.host_id != self.host_id:
            raise FailedPrecondition(
                f"shared-memory reference from host {ref.host_id!r} cannot be read on host "
                f"{self.host_id!r}; ask the producer for nixl or inline",
                reason="FOREIGN_HOST",
            )
        if location.size != ref.byte_size or location.offset < HEADER_BYTES:
            raise InvalidArgument(
                "shm location does not match the TensorRef's byte size",
                reason="TENSOR_SIZE_MISMATCH",
            )
        if not NAME.match(location.name):
            raise InvalidArgument(
                f"{location.name!r} is not an epd segment name", reason="BAD_TENSOR_REF"
            )
        if len(ref.lease_id) != LEASE_ID_CHARS:
            # NOTE: else a longer id, cut to the stamp's length, could pass for a live lease's
            # and reset the mapping its views use.
            raise InvalidArgument(
                f"{ref.lease_id!r} is not an epd lease id", reason="BAD_TENSOR_REF"
            )
        if ref.byte_size <= SMALL_COPY_BYTES:
            return view_bytes(self._read(ref, content_tag), dtype, shape, ref.byte_size)
        cache = self.copies if copy else self.views
        lease_stamp = stamp_of(ref.lease_id)[:LEASE_STAMP_BYTES]
        view = cache.kept_view(location.name, ref.lease_id, lease_stamp) or self._map(
            cache, location.name, ref.lease_id
        )
        if location.offset + location.size > len(view):
            raise InvalidArgument(
                f"segment {location.name} has {len(view)} bytes, the "
                f"reference needs {location.offset + location.size}",
                reason="TENSOR_SIZE_MISMATCH",
            )
        check_stamp(view[:HEADER_BYTES], ref.lease_id, f"segment {location.name}", content_tag)
        if not copy:
            payload_view = view[location.offset :]
            cache.lend(location.name, payload_view)
            return view_bytes(payload_view, dtype, shape, ref.byte_size)
        payload = self.buffers.empty(dtype, shape, ref.byte_size)
        # NOTE: numpy gives the address of a read-only view too, which ctypes refuses.
        source = int(np.frombuffer(view, dtype=np.uint8).ctypes.data) + location.offset
        move(payload.data_ptr(), source, ref.byte_size)
        # NOTE: a lease released during the copy may have let another payload in.
        check_stamp(view[:HEADER_BYTES], ref.lease_id, f"segment {location.name}")
        return payload

    def check(self, ref: tensor_pb2.TensorRef, content_tag: bytes = b"") -> None:
        """That ``ref``'s segment still holds its payload, tagged ``content_tag`` where one is
        expected (NotFound LEASE_RELEASED, FailedPrecondition CONTENT_MISMATCH otherwise): its
        header alone read with ``pread``, for a reader that has used the payload and must know
        it was not released meanwhile (no mapping to set up and tear down)."""
        name = ref.shm.name
        if not NAME.match(name):
            raise InvalidArgument(f"{name!r} is not an epd segment name", reason="BAD_TENSOR_REF")
        fd = self._open(name)
        try:
            header = os.pread(fd, HEADER_BYTES, 0)
        finally:
            os.close(fd)
        check_stamp(header, ref.lease_id, f"segment {name}", content_tag)

    def trim(self) -> None:
        """Forget kept mappings of segments their producers unlinked (they pin memory); reset
        those whose view has died (pages a caller wrote to are freed)."""
        for cache in (self.views, self.copies):
            cache.trim()

    def close(self) -> None:
        for cache in (self.views, self.copies):
            cache.clear()
        self.buffers.close()

    def _open(self, name: str) -> int:
        try:
            return os.open(os.path.join(self._dir, name), os.O_RDONLY)
        except FileNotFoundError:
            raise NotFound(
                f"shared-memory segment {name} is gone (released, expired or its producer died)",
                reason="SEGMENT_NOT_FOUND",
            ) from None

    def _read(self, ref: tensor_pb2.TensorRef, content_tag: bytes) -> bytearray:
        """A private copy of the payload read with ``preadv`` (no mapping to set up and tear
        down), then its stamp read and checked: the copy holds the lease's payload only if the
        stamp still names the lease once every payload byte is in (a read is not atomic with
        respect to a producer that releases the segment and fills it again meanwhile)."""
        location = ref.shm
        payload = bytearray(ref.byte_size)
        fd = self._open(location.name)
        try:
            num_read = os.preadv(fd, [payload], location.offset)
            header = os.pread(fd, HEADER_BYTES, 0)
        finally:
            os.close(fd)
        if num_read != ref.byte_size:
            raise InvalidArgument(
                f"segment {location.name} is shorter than the reference "
                f"needs ({location.offset + location.size} bytes)",
                reason="TENSOR_SIZE_MISMATCH",
            )
        check_stamp(header, ref.lease_id, f"segment {location.name}", content_tag)
        return payload

    def _map(self, cache: MappingCache, name: str, lease_id: str) -> memoryview:
        """A view of a new mapping of the whole segment (private or shared, as ``cache`` keeps
        them), kept for later leases where ``cache`` has room."""
        fd = self._open(name)
        try:
            size = os.fstat(fd).st_size
            # NOTE: a private (copy-on-write) mapping is writable for torch.frombuffer, yet never
            # changes the producer's segment.
            access = mmap.ACCESS_COPY if cache.private else mmap.ACCESS_READ
            buffer = mmap.mmap(fd, size, access=access)
        except BaseException:
            os.close(fd)
            raise
        view = memoryview(buffer)
        if not cache.keep(name, Mapping(fd, buffer, lease_id)):
            os.close(fd)
        return view
