"""Encoded test images."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def encode(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def noise(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def scan_bomb(size: int = 4096, num_scans: int = 2000) -> bytes:
    """A progressive grayscale JPEG of ``size`` x ``size`` blank pixels whose last scan (an AC
    refinement pass over every block) is repeated up to ``num_scans`` scans: a few tens of bytes
    per scan, a pass over the whole image each to decode."""
    data = encode(Image.new("L", (size, size)), "JPEG", progressive=True)
    end_of_image = b"\xff\xd9"
    assert data.endswith(end_of_image)
    last_scan = data[data.rindex(b"\xff\xda") : -len(end_of_image)]
    num_extra = num_scans - data.count(b"\xff\xda")
    return data[: -len(end_of_image)] + last_scan * num_extra + end_of_image
