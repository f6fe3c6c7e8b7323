"""The payload layout both memory backends share (``shm.py``, ``nixl.py``): written by
``stamp_of``, checked by ``check_stamp``.

A payload sits behind a 64-byte stamp: ``MAGIC``, then the lease id, zero-padded to
``LEASE_STAMP_BYTES``, then an optional content tag, zero-padded. A consumer checks the lease part
after reading, so a reference whose lease was released (and whose buffer now holds another
tensor) fails instead of returning someone else's data. The content tag is what the producer
says the payload is (the route tags an image's pixels with their mm_hash): only the producer
writes its buffers, so a consumer that finds the tag it expects trusts the payload's identity
without walking it, whoever sent it the reference. Pooled buffers (shm segments, registered NIXL
blocks) are reused by size class: stamp + payload rounded up to a power of two.
"""

from __future__ import annotations

from epd.common.errors import FailedPrecondition, NotFound

HEADER_BYTES = 64
LEASE_STAMP_BYTES = 40
CONTENT_TAG_BYTES = 16
MAGIC = b"EPDSHM01"
# a lease id fills the stamp's lease part exactly (``base.new_lease_id``: 32 hex digits)
LEASE_ID_CHARS = LEASE_STAMP_BYTES - len(MAGIC)
MIN_PAYLOAD_CLASS_BYTES = 64 << 10


def size_class(num_bytes: int) -> int:
    """Buffer capacity for a payload: header + payload rounded up to a power of two, so an
    exact power-of-two payload (the common case) does not land in the next, twice larger class."""
    payload = max(num_bytes, MIN_PAYLOAD_CLASS_BYTES)
    return HEADER_BYTES + (1 << (payload - 1).bit_length())


def stamp_of(lease_id: str, content_tag: bytes = b"") -> bytes:
    """The 64-byte header of a buffer holding the payload of ``lease_id``, tagged with
    ``content_tag`` (empty, or ``CONTENT_TAG_BYTES`` bytes)."""
    if len(content_tag) not in (0, CONTENT_TAG_BYTES):
        raise ValueError(f"a content tag has {CONTENT_TAG_BYTES} bytes, not {len(content_tag)}")
    lease = (MAGIC + lease_id.encode()).ljust(LEASE_STAMP_BYTES, b"\0")
    return (lease + content_tag).ljust(HEADER_BYTES, b"\0")


def check_stamp(
    header: bytes | bytearray | memoryview, lease_id: str, holder: str, content_tag: bytes = b""
) -> None:
    """NotFound (LEASE_RELEASED) unless ``header``, read from ``holder`` (a buffer, named in the
    message), carries the stamp of ``lease_id``: else its lease was released and the buffer may
    hold another payload. FailedPrecondition (CONTENT_MISMATCH) unless it carries ``content_tag``
    too, where one is expected."""
    if header[: len(MAGIC)] != MAGIC or header[len(MAGIC) : LEASE_STAMP_BYTES] != lease_id.encode():
        raise NotFound(
            f"lease {lease_id} was released: {holder} no longer holds its payload",
            reason="LEASE_RELEASED",
        )
    tag = header[LEASE_STAMP_BYTES : LEASE_STAMP_BYTES + CONTENT_TAG_BYTES]
    if content_tag and tag != content_tag:
        raise FailedPrecondition(
            f"{holder} does not hold the payload its reference names (content tag "
            f"{content_tag.hex()} expected)",
            reason="CONTENT_MISMATCH",
        )
