"""Decoded images as tensors and back: how the route hands an image's pixels to its encoders.

The layout is uint8 [height, width, 3] RGB, row-major (see MediaItem.pixels). Torch-free: numpy
arrays in, numpy arrays out; the data plane wraps them.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy


def pixels_of(image: Image.Image) -> np.ndarray | None:
    """The pixels of an RGB ``image`` as a writable [height, width, 3] uint8 array (a copy), or
    None for another mode. Walks every pixel (~2.5 ms for 1.2 MP)."""
    if image.mode != "RGB":
        return None
    return np.array(image)


def image_of(pixels: np.ndarray, policy: MediaPolicy) -> Image.Image:
    """The RGB image of ``pixels`` (copied into Pillow's own storage, so ``pixels`` may go as
    soon as this returns); raises InvalidArgument for another layout or too many pixels."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise InvalidArgument(
            f"pixels must be uint8 [height, width, 3], not {pixels.dtype} {list(pixels.shape)}",
            reason="BAD_PIXELS",
        )
    height, width = pixels.shape[:2]
    if not height or not width or height * width > policy.max_pixels:
        raise InvalidArgument(
            f"pixels of {width}x{height} are empty or over the limit of {policy.max_pixels}",
            reason="BAD_PIXELS",
        )
    return Image.fromarray(np.ascontiguousarray(pixels))
