"""A raw video's pixel inputs for an engine that runs its own tower in-process (no grpc).

The route planned the video (frames kept, size, grid); the engine runs the family's video
processor on the kept frames, resized to the plan's size (``ModelFamily.video_pixel_inputs``), as
an encoder does for a chunk, and checks that they give the plan's grid.
"""

from __future__ import annotations

from typing import Any

import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.models.family import ModelFamily
from epd.server.models.video import VideoRefused


def video_pixel_inputs(
    family: ModelFamily, processor: Any, config: Any, video: EngineImage
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel values and grid [1, 3] of ``video``'s raw frames, made by ``processor`` (the
    checkpoint's video processor; ``config`` its model config) on the host; InvalidArgument
    VIDEO_NOT_SUPPORTED for a family that takes no video, BAD_VIDEO_SPAN without the plan's
    size, BAD_VIDEO_PLAN when the frames at that size do not give the video's grid."""
    frames = video.frames
    assert frames is not None, "a raw video"
    if frames.resized is None:
        raise InvalidArgument(
            f"video {video.mm_hash} needs the size its plan resizes its frames to",
            reason="BAD_VIDEO_SPAN",
        )
    pixels = torch.from_numpy(frames.pixels)
    try:
        if processor is None:
            raise family.refuse_video()
        pixel_values, grid = family.video_pixel_inputs(
            processor, pixels, frames.resized, None, config
        )
    except VideoRefused as e:
        raise InvalidArgument(str(e), reason=e.reason) from e
    if tuple(int(v) for v in grid[0]) != video.grid:
        raise InvalidArgument(
            f"video {video.mm_hash}: its frames at {list(frames.resized)} give grid "
            f"{grid[0].tolist()}, not {list(video.grid or ())}",
            reason="BAD_VIDEO_PLAN",
        )
    return pixel_values, grid
