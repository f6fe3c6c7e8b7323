"""The store's value format: a round trip keeps every byte, and a value that was cut, changed,
written for another image or by another version is refused."""

from __future__ import annotations

import struct

import pytest
import torch

from epd.server.encode.cache import CachedEmbedding
from epd.server.store.codec import (
    HEADER,
    VERSION,
    CorruptValue,
    decode_value,
    encode_value,
    store_key,
)

HASH = "0123456789abcdef" * 2
OTHER = "fedcba9876543210" * 2


def entry(dtype: torch.dtype = torch.float32) -> CachedEmbedding:
    return CachedEmbedding(
        torch.randn(24, 64, generator=torch.Generator().manual_seed(1)).to(dtype), (1, 8, 12)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_keeps_every_byte_and_the_grid(dtype: torch.dtype) -> None:
    original = entry(dtype)
    read = decode_value(HASH, encode_value(HASH, original))
    assert read.embeddings.dtype == dtype and read.grid == (1, 8, 12)
    assert torch.equal(read.embeddings.view(torch.uint8), original.embeddings.view(torch.uint8))


def test_the_key_names_the_format_version() -> None:
    assert store_key(HASH) == f"epd-emb-v{VERSION}/{HASH}"


def flipped(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("a payload byte", lambda d: flipped(d, HEADER.size + 5)),
        ("a grid byte", lambda d: flipped(d, 4 + 2 + 2 + 32)),
        ("the digest", lambda d: flipped(d, len(d) - 1)),
        ("cut short", lambda d: d[:-100]),
        ("cut to the header", lambda d: d[: HEADER.size]),
        ("empty", lambda d: b""),
        ("another version", lambda d: d[:4] + struct.pack("<H", VERSION + 1) + d[6:]),
        ("another magic", lambda d: b"XXXX" + d[4:]),
        ("garbage", lambda d: bytes(range(256)) * 40),
    ],
)
def test_a_damaged_value_is_refused(name: str, damage) -> None:
    with pytest.raises(CorruptValue):
        decode_value(HASH, damage(encode_value(HASH, entry())))


def test_a_value_written_for_another_image_is_refused() -> None:
    with pytest.raises(CorruptValue, match="written for"):
        decode_value(OTHER, encode_value(HASH, entry()))


@pytest.mark.parametrize(
    "tensor", [torch.zeros(3, 4, dtype=torch.int64), torch.zeros(0, 4), torch.zeros(1, 1, 1, 1, 1)]
)
def test_what_the_format_cannot_hold_is_a_value_error(tensor: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="cannot store"):
        encode_value(HASH, CachedEmbedding(tensor, (1, 1, 1)))


def test_a_key_that_is_no_mm_hash_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not an mm_hash"):
        encode_value("../etc", entry())
