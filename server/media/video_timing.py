"""A video's frame rate and duration, measured from its decoded frames' timestamps.

Containers declare a frame rate, a duration and a frame count, and any of them may be missing or
wrong; the timestamps of the frames that decoded are what a player shows. The frame rate is the
mean over the clip (frames - 1 over the span from the first timestamp to the last), the duration
that many frames at that rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy


@dataclass(frozen=True, slots=True)
class VideoTiming:
    """``timestamps`` of every decoded frame in seconds from the first (so the first is 0),
    the mean frame rate ``fps`` and the ``duration_s`` (frames / fps)."""

    timestamps: tuple[float, ...]
    fps: float

    @property
    def num_frames(self) -> int:
        return len(self.timestamps)

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.fps


def measure_timing(timestamps: Sequence[float | None], policy: MediaPolicy) -> VideoTiming:
    """The timing of frames decoded with ``timestamps`` (seconds, None where a frame has none),
    refused when there are fewer than two frames, when the timestamps are missing or do not
    increase, or when the frame rate or duration is beyond ``policy``."""
    if not timestamps:
        raise InvalidArgument("the video decodes to no frame", reason="VIDEO_HAS_NO_FRAMES")
    if len(timestamps) == 1:
        raise InvalidArgument(
            "the video decodes to one frame: send a single picture as an image",
            reason="VIDEO_TOO_SHORT",
        )
    seconds = _increasing(timestamps)
    fps = (len(seconds) - 1) / seconds[-1]
    if fps > policy.max_video_fps:
        raise InvalidArgument(
            f"the video's frames are {fps:.4g} per second by their timestamps, the limit is "
            f"{policy.max_video_fps:g}",
            reason="BAD_VIDEO_FPS",
        )
    timing = VideoTiming(seconds, fps)
    if timing.duration_s > policy.max_video_seconds:
        raise InvalidArgument(
            f"the video lasts {timing.duration_s:.1f} seconds, the limit is "
            f"{policy.max_video_seconds:g}",
            reason="VIDEO_TOO_LONG",
        )
    return timing


def _increasing(timestamps: Sequence[float | None]) -> tuple[float, ...]:
    """``timestamps`` from the first, refused unless every frame has one and each is later."""
    present = [stamp for stamp in timestamps if stamp is not None]
    if len(present) < len(timestamps):
        raise InvalidArgument(
            "some of the video's frames carry no timestamp, so its frame rate is unknown",
            reason="BAD_VIDEO_FPS",
        )
    seconds = tuple(stamp - present[0] for stamp in present)
    if any(later <= earlier for earlier, later in zip(seconds, seconds[1:], strict=False)):
        raise InvalidArgument(
            "the video's frame timestamps do not increase, so its frame rate is unknown",
            reason="BAD_VIDEO_FPS",
        )
    return seconds
