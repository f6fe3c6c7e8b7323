"""Video chunks on an encoder: which frames an item names, and where they come from.

The route cuts a video's kept frames into chunks at temporal-patch boundaries (``VideoSpan``:
a run of kept frames and the size the plan resizes them to) and asks encoders for each chunk as
an item named by the chunk's content hash. The frames come as the route's shared pixels (uint8
[n, height, width, 3], tagged with that hash) or, where those cannot be read, from the video's
source: decoded and planned here as the route did (``VideoLoader``, under the settings the route
planned it with), the span's frames cut out and hashed again, which must give the item's hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from epd.common.errors import InvalidArgument
from epd.server.media.hashing import salted
from epd.server.media.video_hashing import chunk_hash
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import NO_OVERRIDES, VideoOverrides, overrides_of
from epd.v1 import multimodal_pb2


@dataclass(frozen=True, slots=True)
class VideoSpan:
    """A run of ``num_frames`` kept frames from ``first_frame``, resized to ``resized``
    (height, width), of a video planned under ``settings``."""

    first_frame: int
    num_frames: int
    resized: tuple[int, int]
    settings: VideoOverrides = NO_OVERRIDES

    @classmethod
    def from_proto(cls, span: multimodal_pb2.VideoSpan) -> VideoSpan:
        """The span of a ``MediaItem.video``; InvalidArgument (BAD_VIDEO_SPAN) when empty or
        its settings are not video processor settings."""
        if not (span.num_frames and span.resized_height and span.resized_width):
            raise InvalidArgument(
                "a video item needs frames and a resized size", reason="BAD_VIDEO_SPAN"
            )
        resized = (span.resized_height, span.resized_width)
        return cls(span.first_frame, span.num_frames, resized, overrides_of(span.video_settings))

    @property
    def stop(self) -> int:
        """Position after the run's last frame."""
        return self.first_frame + self.num_frames


async def frames_from_source(
    loader: VideoLoader, url: str, data: bytes, span: VideoSpan, mm_hash: str, key_salt: str = ""
) -> np.ndarray:
    """The kept frames ``span`` names of the video at ``url`` or in ``data``, checked against
    the chunk's ``mm_hash`` salted with ``key_salt`` (a tenant's, ``hashing.salted``; "": none)
    (InvalidArgument MM_HASH_MISMATCH: the caller planned or hashed the video otherwise, e.g. for
    another model; BAD_VIDEO_SPAN: the video has no such frames)."""
    video = await loader.load(url=url, data=data, overrides=span.settings)
    if span.stop > len(video.frames) or span.resized != video.plan.resized:
        raise InvalidArgument(
            f"the video keeps {len(video.frames)} frames resized to {video.plan.resized}, not "
            f"frames {span.first_frame}..{span.stop - 1} resized to {span.resized}",
            reason="BAD_VIDEO_SPAN",
        )
    frames = video.frames[span.first_frame : span.stop]
    planner = loader.planner
    digest = chunk_hash(
        frames,
        span.resized,
        video.plan.temporal_patch_size,
        model_id=planner.model_id,
        fingerprint=planner.fingerprint,
    )
    if mm_hash and salted(digest, key_salt) != mm_hash:
        raise InvalidArgument(
            f"mm_hash {mm_hash} does not match the video chunk ({digest}); the caller hashes "
            "with another model id or processor",
            reason="MM_HASH_MISMATCH",
        )
    return frames
