"""The payload layout both memory backends share (``shm.py``, ``nixl.py``).

A payload sits behind a 64-byte lease stamp: ``MAGIC``, then the lease id, zero-padded. A
consumer checks the stamp after reading, so a reference whose lease was released (and whose
buffer now holds another tensor) fails instead of returning someone else's data. Pooled buffers
(shm segments, registered NIXL blocks) are reused by size class: stamp + payload rounded up to a
power of two.
"""

from __future__ import annotations

HEADER_BYTES = 64
MAGIC = b"EPDSHM01"
MIN_PAYLOAD_CLASS_BYTES = 64 << 10


def size_class(num_bytes: int) -> int:
    """Buffer capacity for a payload: header + payload rounded up to a power of two, so an
    exact power-of-two payload (the common case) does not land in the next, twice larger class."""
    payload = max(num_bytes, MIN_PAYLOAD_CLASS_BYTES)
    return HEADER_BYTES + (1 << (payload - 1).bit_length())


def stamp_of(lease_id: str) -> bytes:
    """The 64-byte header of a buffer holding the payload of ``lease_id``."""
    return (MAGIC + lease_id.encode()).ljust(HEADER_BYTES, b"\0")
