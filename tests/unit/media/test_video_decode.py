"""Videos decode from memory to the frames PyAV gives, counted and timed from the frames
themselves, whatever the container declares."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from epd.server.media.policy import MediaPolicy
from epd.server.media.video import decode_video
from tests.unit.models.clips import make_clip, pyav_frames

POLICY = MediaPolicy()
EVERY_THIRD = lambda stream: range(0, stream.num_frames, 3)  # noqa: E731

FORMATS = [
    ("mp4", "libx264", "mp4", "h264"),
    ("mov", "libx264", "mov", "h264"),
    ("webm", "libvpx-vp9", "webm", "vp9"),
    ("webm", "libvpx", "webm", "vp8"),
    ("matroska", "libx264", "matroska", "h264"),
]


@pytest.mark.parametrize(("muxer", "encoder", "container", "codec"), FORMATS)
def test_a_clip_decodes_to_its_frames_counted_and_timed(
    muxer: str, encoder: str, container: str, codec: str
) -> None:
    data = make_clip(muxer, encoder, num_frames=25, fps=10)

    video = decode_video(data, POLICY, EVERY_THIRD)

    stream = video.stream
    assert (stream.container, stream.codec) == (container, codec)
    assert (stream.num_frames, stream.width, stream.height) == (25, 64, 48)
    assert stream.fps == pytest.approx(10.0)
    assert stream.timing.duration_s == pytest.approx(2.5)
    assert stream.timing.timestamps[:3] == pytest.approx((0.0, 0.1, 0.2))
    assert video.frame_indices == tuple(range(0, 25, 3))
    np.testing.assert_array_equal(video.frames, pyav_frames(data)[list(video.frame_indices)])


def test_frames_may_be_chosen_in_any_order_and_more_than_once() -> None:
    data = make_clip(num_frames=8)
    video = decode_video(data, POLICY, lambda stream: [5, 1, 5, 0])
    np.testing.assert_array_equal(video.frames, pyav_frames(data)[[5, 1, 5, 0]])


def test_a_container_declaring_no_frame_count_is_counted() -> None:
    data = make_clip("webm", "libvpx-vp9", num_frames=13)
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].frames == 0

    assert decode_video(data, POLICY, EVERY_THIRD).stream.num_frames == 13


def test_a_container_lying_about_its_duration_is_timed_by_its_frames() -> None:
    data = lie_about_duration(make_clip("webm", "libvpx-vp9", num_frames=20, fps=10), 100_000)
    with av.open(io.BytesIO(data)) as container:
        assert container.duration == 100_000 * av.time_base

    stream = decode_video(data, POLICY, EVERY_THIRD).stream

    assert (stream.num_frames, stream.fps, stream.timing.duration_s) == (20, 10.0, 2.0)


def test_the_chooser_sees_the_counted_stream_before_any_frame_is_kept() -> None:
    seen = []
    decode_video(make_clip(num_frames=9), POLICY, lambda stream: seen.append(stream) or [0])
    assert [stream.num_frames for stream in seen] == [9]


def test_frames_out_of_the_counted_range_are_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="not within 6 frames"):
        decode_video(make_clip(num_frames=6), POLICY, lambda stream: [6])


def lie_about_duration(data: bytes, seconds: int) -> bytes:
    """``data`` (a WebM whose ``Duration`` element holds a double, in milliseconds) declaring
    ``seconds``."""
    patched = bytearray(data)
    at = patched.index(b"\x44\x89")
    assert patched[at + 2] == 0x88, "an 8-byte Duration"
    struct.pack_into(">d", patched, at + 3, seconds * 1000.0)
    return bytes(patched)
