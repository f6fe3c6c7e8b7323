"""A raw VideoInput -> EngineImage with the video's kept frames (no grpc), for an encode_prefill
worker whose engine runs its own video processor and tower (EPD, EP/D).

The route decoded and planned the video once; its kept frames come as the route's shared pixels,
in a segment it tagged with the video's mm_hash (only the route writes that tag), and the plan's
timing (frame rate, decoded frame count, kept frames' indices) in the message: nothing is decoded
or hashed again. Where the pixels cannot be read (another host, released), the source is decoded
and planned here as the route did (``VideoLoader``), which must give the video's mm_hash.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from epd.common.errors import EpdError, FailedPrecondition, InvalidArgument
from epd.server.engine.base import EngineImage, VideoFrames
from epd.server.media.hashing import is_mm_hash, pixels_tag, salted
from epd.server.media.pixels import check_frames
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import overrides_of
from epd.server.transfer.plane import DataPlane
from epd.v1 import multimodal_pb2

logger = logging.getLogger(__name__)


async def raw_video(
    plane: DataPlane, loader: VideoLoader | None, index: int, video: multimodal_pb2.VideoInput
) -> EngineImage:
    """Video ``index`` of a prompt as its kept frames and the route's plan; InvalidArgument
    when the message lacks what the engine needs, FailedPrecondition RAW_VIDEOS_UNSUPPORTED
    when the frames must be decoded here and this worker has no video loader."""
    if not (video.HasField("grid") and is_mm_hash(video.mm_hash)):
        raise InvalidArgument(
            f"video {index} needs its grid and mm_hash", reason="MISSING_IMAGE_DATA"
        )
    frames = _shared_frames(plane, video, loader)
    if frames is None:
        frames = await _planned_again(loader, index, video)
    grid = (video.grid.t, video.grid.h, video.grid.w)
    return EngineImage(
        video.mm_hash,
        grid,
        seconds_per_temporal_patch=video.seconds_per_temporal_patch,
        timestamps=tuple(video.timestamps),
        frames=frames,
    )


def _shared_frames(
    plane: DataPlane, video: multimodal_pb2.VideoInput, loader: VideoLoader | None
) -> VideoFrames | None:
    """The route's kept frames of ``video`` with the message's timing, if the route shared
    them in a segment it tagged with the video's mm_hash and they were still tagged so once
    copied (a copying read checks that); else None (another host, released, none shared, not
    frames the timing fits)."""
    media = video.media
    if not media.HasField("pixels"):
        return None
    tag = pixels_tag(video.mm_hash)
    try:
        pixels = plane.get(media.pixels, copy=True, content_tag=tag)
        max_pixels = loader.policy.max_video_frame_pixels if loader is not None else None
        return _checked(pixels, video, max_pixels)
    except EpdError as e:
        logger.debug("frames of %s unreadable here (%s): decoding the source", video.mm_hash, e)
        return None


def _checked(
    pixels: torch.Tensor, video: multimodal_pb2.VideoInput, max_pixels: int | None
) -> VideoFrames:
    """``pixels`` with ``video``'s timing if they are its kept frames (uint8 [frames, height,
    width, 3], one per kept frame index, within the frame pixel limit) and the timing is sound;
    else InvalidArgument BAD_PIXELS or BAD_VIDEO_TIMING."""
    check_frames(pixels, len(video.frame_indices), max_pixels)
    indices = tuple(video.frame_indices)
    is_ordered = all(a < b for a, b in zip(indices, indices[1:], strict=False))
    if not (video.fps > 0 and is_ordered and indices[-1] < video.num_decoded_frames):
        raise InvalidArgument(
            f"video {video.mm_hash}: frame rate {video.fps}, {video.num_decoded_frames} decoded "
            f"frames and kept indices {list(indices)} do not fit together",
            reason="BAD_VIDEO_TIMING",
        )
    span = video.media.video
    resized = (span.resized_height, span.resized_width) if span.resized_height else None
    return VideoFrames(pixels.numpy(), video.fps, video.num_decoded_frames, indices, resized)


async def _planned_again(
    loader: VideoLoader | None, index: int, video: multimodal_pb2.VideoInput
) -> VideoFrames:
    """The kept frames of ``video``'s source decoded and planned here, under the settings the
    route planned it with, which must hash to the video's mm_hash (salted with its
    ``key_salt``, a tenant's)."""
    media = video.media
    if loader is None:
        raise FailedPrecondition(
            "this worker takes video embeddings, not raw videos", reason="RAW_VIDEOS_UNSUPPORTED"
        )
    if media.WhichOneof("source") is None:
        raise InvalidArgument(
            f"video {index} has neither chunks nor a source", reason="MISSING_IMAGE_DATA"
        )
    overrides = overrides_of(media.video.video_settings)
    planned = await loader.load(url=media.url, data=media.data, overrides=overrides)
    if salted(planned.video_hash, media.key_salt) != video.mm_hash:
        raise InvalidArgument(
            f"mm_hash {video.mm_hash} does not match video {index} ({planned.video_hash}); the "
            "caller hashes with another model id or processor",
            reason="MM_HASH_MISMATCH",
        )
    stream, plan = planned.stream, planned.plan
    frames: np.ndarray = planned.frames
    indices = tuple(plan.frame_indices)
    return VideoFrames(frames, stream.fps, stream.num_frames, indices, plan.resized)
