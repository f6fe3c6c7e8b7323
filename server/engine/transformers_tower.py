"""The transformers engine's own vision tower on raw pictures and videos (an encode_prefill
worker's raw media), in-process, no grpc.

A picture goes through the family's image processor within its pixel budget; a video's kept
frames, resized to the size the route planned (frames kept, size, grid), through the family's
video processor (``ModelFamily.video_pixel_inputs``), as an encoder does for a chunk, checked to
give the plan's grid; then the family's tower turns the pixel values into embeddings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.models.family import ModelFamily
from epd.server.models.video import VideoRefused


def tower_embeddings(
    family: ModelFamily, model: Any, processor: Any, device: str, image: EngineImage
) -> EngineImage:
    """``image`` (a raw picture or video) as the embeddings and grid of ``model``'s own
    processor (``processor``: the checkpoint's) and tower, on ``device`` (the model's)."""
    if image.frames is not None:
        video_processor = getattr(processor, "video_processor", None)
        pixel_values, grid = video_pixel_inputs(family, video_processor, model.config, image)
    else:
        image_processor = family.image_processor_within(
            processor.image_processor, image.image_settings.settings
        )
        pixel_values, grid = family.pixel_inputs(image_processor, [image.image], model.config)
    pixel_values = pixel_values.to(device, model.dtype)
    features = family.image_embeddings(family.model_tower(model), pixel_values, grid.to(device))
    t, h, w = (int(v) for v in grid[0])
    return replace(image, grid=(t, h, w), embeddings=features, image=None, frames=None)


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
