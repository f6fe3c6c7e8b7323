"""``bench_e2e.py --video``: how a system's encoders cut the clip, the ratios of its table, and
the clips it sends (distinct per seed, moving, and the same pixels to vLLM as epd keeps)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.unit.scripts.loader import load

e2e_video = load("e2e_video")
video_clips = load("video_clips")
bench_e2e = load("bench_e2e")
SHAPE = video_clips.ClipShape(64, 48, 2.0, 10)


@pytest.mark.parametrize(
    "system, encoders",
    [
        ("e-pd", 1),
        ("e-pd@auto", 1),
        ("e-pd@auto/auto", 2),
        ("e-pd:per_image@cuda/cuda/cuda", 3),
        ("epd@cpu/cpu+metrics", 2),
        ("vllm", 0),
    ],
)
def test_encoders_are_counted_from_the_devices_after_the_at(system: str, encoders: int) -> None:
    assert e2e_video.num_encoders(system) == encoders


def test_the_clip_is_cut_into_one_chunk_per_encoder() -> None:
    assert [e2e_video.chunk_patches(s, 6) for s in ("e-pd", "e-pd@a/a", "e-pd@a/a/a")] == [6, 3, 2]
    assert e2e_video.chunk_patches("e-pd@auto/auto", 7) == 4
    assert e2e_video.chunk_patches("vllm", 6) is None


def row(system: str, ttft: float, req_s: float, clip: str = "320x240") -> object:
    return e2e_video.VideoRow(
        system, clip, e2e_video.num_encoders(system), None, 1, 4, 0, ttft, ttft, 1.0, 1.0, req_s
    )


def test_ratios_are_to_one_encoder_of_the_same_topology_and_to_vllm_at_the_same_clip() -> None:
    rows = [
        row("e-pd@auto", 200.0, 2.0),
        row("e-pd:per_image@auto/auto", 150.0, 3.0),
        row("epd@auto/auto", 100.0, 1.0),
        row("vllm", 100.0, 4.0),
        row("e-pd@auto/auto", 50.0, 1.0, clip="640x480"),
    ]
    e2e_video.compare(rows)
    assert [r.ttft_p50_vs_one_encoder for r in rows] == [1.0, 0.75, None, None, None]
    assert [r.ttft_p50_vs_vllm for r in rows] == [2.0, 1.5, 1.0, 1.0, None]
    assert [r.req_s_vs_vllm for r in rows] == [0.5, 0.75, 0.25, 1.0, None]


def test_answers_are_marked_against_vllms_on_the_same_clip() -> None:
    rows = [row("e-pd@auto", 1.0, 1.0), row("e-pd@auto/auto", 1.0, 1.0), row("vllm", 1.0, 1.0)]
    answers = {"e-pd@auto": {"320x240": "a b"}, "e-pd@auto/auto": {"320x240": "a c"}}
    e2e_video.mark_answers(rows, {**answers, "vllm": {"320x240": "a b"}})
    assert [r.same_answer_as_vllm for r in rows] == [True, False, None]


@pytest.mark.parametrize("text", ["320", "320x", "x240", "axb"])
def test_a_malformed_clip_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        video_clips.ClipShape.parse(text, 6, 10)


def test_clips_are_the_same_for_a_seed_distinct_between_seeds_and_moving() -> None:
    first = video_clips.clip_frames(1, SHAPE)
    assert first.shape == (20, 48, 64, 3) and first.dtype == np.uint8
    assert np.array_equal(first, video_clips.clip_frames(1, SHAPE))
    assert not np.array_equal(first, video_clips.clip_frames(2, SHAPE))
    assert all(not np.array_equal(a, b) for a, b in zip(first, first[1:], strict=False))


def test_pictures_of_a_request_come_before_its_question() -> None:
    content = bench_e2e.pictures_of(3, images=2)
    assert [part["type"] for part in content] == ["image_url", "image_url", "text"]


def test_vllm_gets_exactly_the_frames_epd_keeps(tiny_model_dir: Path) -> None:
    clips = video_clips.VideoClips(tiny_model_dir)
    assert clips.temporal_patches(SHAPE) == 2  # 20 frames at 10 fps, 2 kept a second
    clip = clips.clip(7, SHAPE)
    assert clips.clip(7, SHAPE) is clip
    assert clip.part()["video_url"]["url"].startswith("data:video/mp4;base64,")
    url = clip.vllm_part()["video_url"]["url"]
    prefix, _, frames = url.partition(",")
    assert prefix == "data:video/jpeg;base64"
    decoded = [np.asarray(Image.open(io.BytesIO(base64.b64decode(f)))) for f in frames.split(",")]
    assert len(decoded) == 4
    assert np.array_equal(np.stack(decoded), clip.kept_frames)
