"""Test pictures: deterministic random RGB images and their PNG bytes."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def picture(seed: int, width: int = 64, height: int = 48) -> Image.Image:
    """A ``width`` x ``height`` RGB image of random pixels, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def png(image: Image.Image) -> bytes:
    """``image`` encoded as PNG."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(image: Image.Image) -> str:
    """``image`` as a PNG ``data:`` URL, as OpenAI bodies carry pictures."""
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()
