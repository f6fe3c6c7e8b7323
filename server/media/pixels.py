"""Decoded images and video frames handed between processes: how the route shares their pixels
with encoders and encode_prefill workers. The layout is uint8 [height, width, 3] RGB, row-major,
and [frames, height, width, 3] for a video's frames (see MediaItem.pixels)."""

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


def check_frames(
    frames: torch.Tensor, num_frames: int, max_frame_pixels: int | None
) -> torch.Tensor:
    """``frames`` if they are ``num_frames`` RGB frames within the frame pixel limit (None:
    none); else InvalidArgument (BAD_PIXELS)."""
    shape = list(frames.shape)
    if frames.dtype != torch.uint8 or frames.ndim != 4 or shape[0] != num_frames or shape[3] != 3:
        raise InvalidArgument(
            f"video frames must be uint8 [{num_frames}, height, width, 3], not "
            f"{frames.dtype} {shape}",
            reason="BAD_PIXELS",
        )
    area = shape[1] * shape[2]
    if not area or (max_frame_pixels is not None and area > max_frame_pixels):
        raise InvalidArgument(
            f"video frames of {shape[2]}x{shape[1]} are empty or over the limit of "
            f"{max_frame_pixels} pixels",
            reason="BAD_PIXELS",
        )
    return frames
