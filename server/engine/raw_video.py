"""A raw video's pixel inputs for an engine that runs its own tower in-process (no grpc).

The route planned the video (frames kept, size, grid) from the clip's sizes alone; the engine
plans it again from the same sizes (cheap: nothing is decoded) to learn the size its frames are
resized to, checks that the plan is the route's, and runs the family's video processor on the
kept frames (``ModelFamily.video_pixel_inputs``), as an encoder does for a chunk.
"""

from __future__ import annotations

from typing import Any

import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.models.family import ModelFamily
from epd.server.models.video import VideoClip, VideoRefused


def video_pixel_inputs(
    family: ModelFamily, processor: Any, config: Any, video: EngineImage
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel values and grid [1, 3] of ``video``'s raw frames, made by ``processor`` (the
    checkpoint's video processor; ``config`` its model config) on the host; InvalidArgument
    VIDEO_NOT_SUPPORTED for a family that takes no video, BAD_VIDEO_PLAN when the frames and
    their timing do not give the video's grid."""
    frames = video.frames
    assert frames is not None, "a raw video"
    height, width = frames.pixels.shape[1:3]
    clip = VideoClip(frames.num_decoded_frames, frames.fps, int(width), int(height))
    try:
        if processor is None:
            raise family.refuse_video()
        plan = family.plan_video(clip, config, processor)
    except VideoRefused as e:
        raise InvalidArgument(str(e), reason=e.reason) from e
    if plan.frame_indices != frames.frame_indices or plan.grid != video.grid:
        raise InvalidArgument(
            f"video {video.mm_hash}: this model keeps frames {list(plan.frame_indices)} in grid "
            f"{list(plan.grid)}, not {list(frames.frame_indices)} in {list(video.grid or ())}",
            reason="BAD_VIDEO_PLAN",
        )
    pixels = torch.from_numpy(frames.pixels)
    pixel_values, grid = family.video_pixel_inputs(processor, pixels, plan.resized, None, config)
    return pixel_values, grid
