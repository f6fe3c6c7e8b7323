"""How one image's embeddings are written into the store and read back, checked.

A key is ``epd-emb-v{VERSION}/{mm_hash}``: a change of this format bumps ``VERSION``, so a reader
never parses bytes of another format. A value is a fixed header (magic, version, dtype, shape,
grid, the mm_hash it was written for, the payload's length), the tensor's bytes, and a digest of
both: a value that was cut, overwritten or written for another key is refused (``CorruptValue``).
"""

from __future__ import annotations

import hashlib
import math
import struct

import torch

from epd.server.encode.cache import CachedEmbedding
from epd.server.media.hashing import MM_HASH_CHARS, is_mm_hash

VERSION = 1
MAGIC = b"EPDE"
MAX_DIMS = 4
DIGEST_BYTES = 16
# magic, version, dtype, number of dims, mm_hash, grid (3), shape (4), payload bytes
HEADER = struct.Struct(f"<4sHBB{MM_HASH_CHARS}s3I{MAX_DIMS}QQ")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class CorruptValue(ValueError):
    """Bytes read from the store that are not a value this version wrote for the key."""


def store_key(mm_hash: str) -> str:
    """The store's key of ``mm_hash``'s embeddings, in this format's version."""
    return f"epd-emb-v{VERSION}/{mm_hash}"


def encode_value(mm_hash: str, entry: CachedEmbedding) -> bytes:
    """The bytes stored for ``entry``, the embeddings of ``mm_hash`` (copied to host memory);
    ValueError for a dtype or a number of dims this format does not hold."""
    tensor = entry.embeddings.detach().contiguous().cpu()
    if tensor.dtype not in DTYPES or not 1 <= tensor.dim() <= MAX_DIMS or not tensor.numel():
        raise ValueError(f"cannot store embeddings of {tensor.dtype}, shape {tuple(tensor.shape)}")
    if not is_mm_hash(mm_hash):
        raise ValueError(f"{mm_hash!r} is not an mm_hash")
    payload = tensor.view(torch.uint8).numpy().tobytes()
    shape = (*tensor.shape, *[0] * (MAX_DIMS - tensor.dim()))
    header = HEADER.pack(
        MAGIC,
        VERSION,
        DTYPES.index(tensor.dtype),
        tensor.dim(),
        mm_hash.encode(),
        *entry.grid,
        *shape,
        len(payload),
    )
    return header + payload + _digest(header, payload)


def decode_value(mm_hash: str, data: bytes) -> CachedEmbedding:
    """The embeddings of ``mm_hash`` held in ``data`` (a fresh host tensor); CorruptValue when
    ``data`` is not a value of this version written for ``mm_hash``, whole and unchanged."""
    body_end = len(data) - DIGEST_BYTES
    if body_end < HEADER.size:
        raise CorruptValue(f"{len(data)} bytes: shorter than a value's header")
    fields = HEADER.unpack_from(data)
    magic, version, dtype_index, num_dims, written_for = fields[:5]
    grid, shape, num_bytes = fields[5:8], fields[8 : 8 + MAX_DIMS], fields[-1]
    if magic != MAGIC or version != VERSION:
        raise CorruptValue(f"not a version {VERSION} value (magic {magic!r}, version {version})")
    if written_for != mm_hash.encode():
        raise CorruptValue(f"a value written for {written_for[:8]!r}..., not {mm_hash}")
    if num_bytes != body_end - HEADER.size:
        raise CorruptValue(f"payload of {body_end - HEADER.size} bytes, header says {num_bytes}")
    payload = memoryview(data)[HEADER.size : body_end]
    if _digest(memoryview(data)[: HEADER.size], payload) != data[body_end:]:
        raise CorruptValue("digest mismatch: the value was changed or cut")
    if dtype_index >= len(DTYPES) or not 1 <= num_dims <= MAX_DIMS:
        raise CorruptValue(f"dtype {dtype_index} or {num_dims} dims out of range")
    dtype, dims = DTYPES[dtype_index], tuple(shape[:num_dims])
    if not num_bytes or math.prod(dims) * dtype.itemsize != num_bytes:
        raise CorruptValue(f"shape {dims} of {dtype} does not fill {num_bytes} bytes")
    tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(dims)
    return CachedEmbedding(tensor, (grid[0], grid[1], grid[2]))


def _digest(header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
    digest = hashlib.sha256(header)
    digest.update(payload)
    return digest.digest()[:DIGEST_BYTES]
