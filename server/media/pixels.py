"""Decoded images handed between processes: how the route shares an image's pixels with its
encoders. The layout is uint8 [height, width, 3] RGB, row-major (see MediaItem.pixels)."""

from __future__ import annotations

import torch

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy


def check_pixels(pixels: torch.Tensor, policy: MediaPolicy) -> torch.Tensor:
    """``pixels`` if they are an RGB image within ``policy``'s pixel limit; else
    InvalidArgument (BAD_PIXELS)."""
    if pixels.dtype != torch.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
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
    return pixels
