"""Every video limit and every malformed video is refused with its own reason (a 400 later),
the bombs before a frame is decoded; nothing else escapes."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from epd.common.errors import InvalidArgument
from epd.server.media import video as video_module
from epd.server.media.policy import MediaPolicy
from epd.server.media.video import check_num_videos, check_video_tokens, decode_video
from epd.server.media.video_timing import measure_timing
from tests.unit.models.clips import make_clip

POLICY = MediaPolicy()
FIRST = lambda stream: [0]  # noqa: E731


def refusal(data: bytes, policy: MediaPolicy = POLICY) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as refused:
        decode_video(data, policy, FIRST)
    return refused.value


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any frame is decoded."""

    def decoding(*args: object) -> None:
        raise AssertionError("a frame was decoded")

    monkeypatch.setattr(video_module, "_frames", decoding)


CASES: list[tuple[str, Callable[[], bytes], MediaPolicy, str]] = [
    ("empty", lambda: b"", POLICY, "EMPTY_VIDEO"),
    ("bytes", lambda: make_clip(), replace(POLICY, max_video_bytes=1000), "VIDEO_TOO_LARGE"),
    (
        "long",
        lambda: make_clip(num_frames=30),
        replace(POLICY, max_video_seconds=2.5),
        "VIDEO_TOO_LONG",
    ),
    ("fps", lambda: make_clip(num_frames=10, fps=1000), POLICY, "BAD_VIDEO_FPS"),
    ("one frame", lambda: make_clip(num_frames=1), POLICY, "VIDEO_TOO_SHORT"),
    ("no container", lambda: b"not a video at all, just words", POLICY, "BAD_VIDEO"),
    (
        "avi",
        lambda: b"RIFF\x00\x00\x00\x00AVI LIST" + bytes(64),
        POLICY,
        "UNSUPPORTED_VIDEO_FORMAT",
    ),
    (
        "mov refused",
        lambda: make_clip("mov"),
        replace(POLICY, video_containers=("mp4",)),
        "UNSUPPORTED_VIDEO_FORMAT",
    ),
    ("codec", lambda: make_clip("mp4", "mpeg4"), POLICY, "UNSUPPORTED_VIDEO_CODEC"),
    (
        "timeout",
        lambda: make_clip(),
        replace(POLICY, video_decode_timeout_s=1e-9),
        "VIDEO_DECODE_TIMEOUT",
    ),
    ("truncated mp4", lambda: make_clip(num_frames=30)[:1500], POLICY, "BAD_VIDEO"),
    ("ebml garbage", lambda: b"\x1a\x45\xdf\xa3" + bytes(200), POLICY, "BAD_VIDEO"),
]


@pytest.mark.parametrize(
    ("make", "policy", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_video_is_refused_with_its_reason(
    make: Callable[[], bytes], policy: MediaPolicy, reason: str
) -> None:
    error = refusal(make(), policy)
    assert error.reason == reason
    assert "Errno" not in error.message and "avcodec" not in error.message


def test_too_many_decoded_frames_are_refused_as_they_decode() -> None:
    data = make_clip("webm", "libvpx-vp9", num_frames=12)  # declares no frame count
    assert refusal(data, replace(POLICY, max_video_frames=10)).reason == "TOO_MANY_VIDEO_FRAMES"


@pytest.mark.usefixtures("no_decoding")
def test_a_declared_frame_count_over_the_limit_is_refused_before_decoding() -> None:
    error = refusal(make_clip(num_frames=12), replace(POLICY, max_video_frames=10))
    assert error.reason == "TOO_MANY_VIDEO_FRAMES"
    assert "declares 12 frames" in error.message


@pytest.mark.usefixtures("no_decoding")
def test_frames_larger_than_the_limit_are_refused_before_decoding() -> None:
    data = make_clip(num_frames=2, width=1280, height=720)
    error = refusal(data, replace(POLICY, max_video_frame_pixels=1280 * 720 - 1))
    assert (error.reason, error.message) == (
        "VIDEO_FRAME_TOO_LARGE",
        f"video frames are 1280x720 pixels, the limit is {1280 * 720 - 1} pixels",
    )


@pytest.mark.usefixtures("no_decoding")
def test_a_file_without_a_video_stream_is_refused() -> None:
    import io

    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as output:
        stream = output.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame(format="s16", layout="mono", samples=800)
        frame.sample_rate = 8000
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        for packet in [*stream.encode(frame), *stream.encode()]:
            output.mux(packet)
    assert refusal(buffer.getvalue()).reason == "VIDEO_HAS_NO_FRAMES"


def test_timestamps_that_do_not_increase_or_are_missing_have_no_frame_rate() -> None:
    for stamps in ([0.0, 0.0, 0.0], [0.0, 0.2, 0.1], [0.0, None, 0.2]):
        with pytest.raises(InvalidArgument) as refused:
            measure_timing(stamps, POLICY)
        assert refused.value.reason == "BAD_VIDEO_FPS"


def test_no_frame_at_all_is_refused() -> None:
    with pytest.raises(InvalidArgument) as refused:
        measure_timing([], POLICY)
    assert refused.value.reason == "VIDEO_HAS_NO_FRAMES"


def test_too_many_videos_in_a_prompt_are_refused() -> None:
    check_num_videos(4, POLICY)
    with pytest.raises(InvalidArgument) as refused:
        check_num_videos(5, POLICY)
    assert refused.value.reason == "TOO_MANY_VIDEOS"


def test_videos_whose_tokens_together_pass_the_limit_are_refused() -> None:
    policy = replace(POLICY, max_video_tokens=200)
    check_video_tokens([100, 100], policy)
    check_video_tokens([], policy)
    for tokens in ([100, 101], [201], [1] * 201):
        with pytest.raises(InvalidArgument) as refused:
            check_video_tokens(tokens, policy)
        assert refused.value.reason == "TOO_MANY_VIDEO_TOKENS"
        assert "--media-max-video-tokens" in refused.value.message


@pytest.mark.parametrize(("muxer", "encoder"), [("mp4", "libx264"), ("webm", "libvpx-vp9")])
def test_damaged_videos_decode_or_are_refused_never_crash(muxer: str, encoder: str) -> None:
    data = make_clip(muxer, encoder, num_frames=12)
    rng = random.Random(45)
    for _ in range(40):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 20)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cut = rng.choice([len(damaged), rng.randrange(len(damaged))])
        try:
            video = decode_video(bytes(damaged[:cut]), POLICY, FIRST)
        except InvalidArgument:
            continue
        assert video.frames.shape[1:] == (48, 64, 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"video_containers": ("avi",)}, "are not among"),
        ({"video_codecs": ("h265x",)}, "not codecs FFmpeg knows"),
        ({"max_video_seconds": 0}, "must be positive"),
        ({"max_videos": 0}, "must be positive"),
        ({"max_video_tokens": 0}, "must be positive"),
    ],
)
def test_a_bad_video_policy_is_refused_at_construction(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(POLICY, **change)
