"""Decode an untrusted video from memory into the RGB frames a model samples, or refuse.

Nothing the container declares about length is trusted: the frames are counted as they decode,
and the frame rate and duration are measured from their timestamps (``pts`` x the stream's
``time_base``), so a container declaring 0 frames, or a wrong duration, decodes the same. A
model's sampling needs the number of frames before it can choose them, and keeping every decoded
frame would hold minutes of video in memory, so the bytes are decoded twice: once to count and
time the frames, once to convert the chosen ones to RGB (FFmpeg's ``rgb24``, as transformers'
PyAV reader does). One deadline covers both passes; it is checked between frames, each of which
is bounded by the frame size limit. Every decoder failure is bad input, reported by what is
wrong with the input, never by FFmpeg's text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_container import check_frame_size, detect_container, open_video
from epd.server.media.video_timing import VideoTiming, measure_timing


@dataclass(frozen=True, slots=True)
class VideoStream:
    """What decoding every frame of a video found: its container and codec (FFmpeg's names),
    frame size, the number of frames that decoded and their timing."""

    container: str
    codec: str
    width: int
    height: int
    timing: VideoTiming

    @property
    def num_frames(self) -> int:
        return self.timing.num_frames

    @property
    def fps(self) -> float:
        return self.timing.fps


@dataclass(frozen=True, slots=True)
class DecodedVideo:
    """A video's ``stream`` and the frames sampling chose: ``frame_indices`` into the decoded
    frames, ``frames`` uint8 [len(frame_indices), height, width, 3] (RGB)."""

    stream: VideoStream
    frame_indices: tuple[int, ...]
    frames: np.ndarray


#: chooses the frames to keep, by index into the decoded ones, from what decoding found
ChooseFrames = Callable[[VideoStream], Sequence[int]]


def decode_video(data: bytes, policy: MediaPolicy, choose: ChooseFrames) -> DecodedVideo:
    """Decode ``data`` under ``policy``'s limits, keeping the frames ``choose`` picks."""
    check_video_bytes(data, policy)
    deadline = time.monotonic() + policy.video_decode_timeout_s
    stream = count_frames(data, policy, deadline)
    indices = tuple(int(index) for index in choose(stream))
    if not indices or min(indices) < 0 or max(indices) >= stream.num_frames:
        raise ValueError(f"frame indices {indices} are not within {stream.num_frames} frames")
    return DecodedVideo(stream, indices, read_frames(data, policy, stream, indices, deadline))


def check_video_bytes(data: bytes, policy: MediaPolicy) -> None:
    """Refuse an empty video or one over ``policy.max_video_bytes``."""
    if not data:
        raise InvalidArgument("video is empty", reason="EMPTY_VIDEO")
    if len(data) > policy.max_video_bytes:
        raise InvalidArgument(
            f"video is {len(data)} bytes, the limit is {policy.max_video_bytes}",
            reason="VIDEO_TOO_LARGE",
        )


def check_num_videos(num_videos: int, policy: MediaPolicy) -> None:
    """Refuse a prompt of more than ``policy.max_videos`` videos."""
    if num_videos > policy.max_videos:
        raise InvalidArgument(
            f"the prompt holds {num_videos} videos, the limit is {policy.max_videos}",
            reason="TOO_MANY_VIDEOS",
        )


def check_video_tokens(num_tokens: list[int], policy: MediaPolicy) -> None:
    """Refuse a prompt whose videos' planned tokens (``num_tokens``, one count per video) add
    up to more than ``policy.max_video_tokens``."""
    total = sum(num_tokens)
    if total > policy.max_video_tokens:
        raise InvalidArgument(
            f"the prompt's videos take {total} tokens ({' + '.join(map(str, num_tokens))}), the "
            f"limit is {policy.max_video_tokens} (--media-max-video-tokens)",
            reason="TOO_MANY_VIDEO_TOKENS",
        )


def count_frames(data: bytes, policy: MediaPolicy, deadline: float) -> VideoStream:
    """Decode every frame of ``data`` (none kept) and measure what decoded."""
    container = open_video(data, policy)
    with container:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        timestamps: list[float | None] = []
        for frame in _frames(container, stream, deadline, data):
            _check_frame(frame, width, height, len(timestamps), policy)
            timestamps.append(None if frame.pts is None else float(frame.pts * frame.time_base))
            _check_running_length(timestamps, policy)
        codec = stream.codec_context.codec.canonical_name
    timing = measure_timing(timestamps, policy)
    return VideoStream(str(detect_container(data)), codec, width, height, timing)


def read_frames(
    data: bytes,
    policy: MediaPolicy,
    stream: VideoStream,
    indices: tuple[int, ...],
    deadline: float,
) -> np.ndarray:
    """The frames at ``indices`` (in any order, repeats allowed) of ``data``, decoded again,
    as uint8 [len(indices), height, width, 3]."""
    positions: dict[int, list[int]] = {}
    for position, index in enumerate(indices):
        positions.setdefault(index, []).append(position)
    frames = np.empty((len(indices), stream.height, stream.width, 3), np.uint8)
    num_decoded, last = 0, max(positions)
    container = open_video(data, policy)
    with container:
        for frame in _frames(container, container.streams.video[0], deadline, data):
            for position in positions.get(num_decoded, ()):
                frames[position] = frame.to_ndarray(format="rgb24")
            if num_decoded == last:
                return frames
            num_decoded += 1
    raise InvalidArgument(
        f"the video decoded to {num_decoded} frames the second time, {stream.num_frames} the first",
        reason="BAD_VIDEO",
    )


def _frames(container: Any, stream: Any, deadline: float, data: bytes) -> Iterator[Any]:
    """The decoded frames of ``stream``; decoder failures and the deadline as refusals."""
    decoded = container.decode(stream)
    while True:
        if time.monotonic() > deadline:
            raise InvalidArgument(
                "decoding the video took longer than its time limit: send a shorter or "
                "smaller video",
                reason="VIDEO_DECODE_TIMEOUT",
            )
        try:
            frame = next(decoded)
        except StopIteration:
            return
        except Exception as e:
            name = detect_container(data)
            raise InvalidArgument(
                f"the {name} data is truncated or corrupt", reason="BAD_VIDEO"
            ) from e
        yield frame


def _check_frame(frame: Any, width: int, height: int, num_before: int, policy: MediaPolicy) -> None:
    if (frame.width, frame.height) != (width, height):
        check_frame_size(frame.width, frame.height, policy)
        raise InvalidArgument(
            f"video frames change size from {width}x{height} to {frame.width}x{frame.height}",
            reason="BAD_VIDEO",
        )
    if num_before == policy.max_video_frames:
        raise InvalidArgument(
            f"the video has more than {policy.max_video_frames} frames",
            reason="TOO_MANY_VIDEO_FRAMES",
        )


def _check_running_length(timestamps: list[float | None], policy: MediaPolicy) -> None:
    first, last = timestamps[0], timestamps[-1]
    if first is not None and last is not None and last - first > policy.max_video_seconds:
        raise InvalidArgument(
            f"the video is longer than {policy.max_video_seconds:g} seconds",
            reason="VIDEO_TOO_LONG",
        )
