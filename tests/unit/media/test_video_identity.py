"""A video's identity follows its kept pixels, its plan and the processor's settings, and
nothing else; its chunks are named by their own content, wherever they sit in a clip."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_hashing import (
    chunk_hashes,
    chunk_ranges,
    video_hash,
    video_processor_fingerprint,
)
from epd.server.media.video_planner import VideoPlanner
from epd.server.models.video import VideoPlan
from tests.unit.models.clips import clip_frames, make_clip, remux

POLICY = MediaPolicy()
PLAN = VideoPlan(
    frame_indices=tuple(range(0, 20, 2)),
    resized=(56, 84),
    grid=(5, 4, 6),
    num_tokens=30,
    temporal_patch_size=2,
    sampling="fps=2.0 max_frames=768 min_frames=4",
)
FRAMES = clip_frames(10, 64, 48)


def hash_of(frames: np.ndarray = FRAMES, plan: VideoPlan = PLAN, **names: str) -> str:
    return video_hash(
        frames, plan, model_id=names.get("model_id", "m"), fingerprint=names.get("fp", "f")
    )


def test_the_hash_is_stable_and_follows_pixels_plan_model_and_processor() -> None:
    changed_pixel = FRAMES.copy()
    changed_pixel[7, 3, 5, 1] ^= 1
    variants = [
        hash_of(changed_pixel),
        hash_of(plan=replace(PLAN, sampling="fps=1.0 max_frames=768 min_frames=4")),
        hash_of(plan=replace(PLAN, frame_indices=tuple(range(1, 21, 2)))),
        hash_of(plan=replace(PLAN, resized=(84, 56))),
        hash_of(plan=replace(PLAN, seconds_per_temporal_patch=1.0)),
        hash_of(plan=replace(PLAN, timestamps=(0.25, 1.25, 2.25, 3.25, 4.25))),
        hash_of(model_id="other"),
        hash_of(fp="other"),
    ]
    assert hash_of() == hash_of(FRAMES.copy())
    assert len(hash_of()) == 32
    assert len({hash_of(), *variants}) == len(variants) + 1


def test_chunks_are_cut_at_temporal_patches_the_last_alone_odd() -> None:
    assert chunk_ranges(9, 2, 2) == [range(0, 4), range(4, 8), range(8, 9)]
    assert chunk_ranges(8, 2, 3) == [range(0, 6), range(6, 8)]
    assert chunk_ranges(4, 2, 10) == [range(0, 4)]
    with pytest.raises(ValueError):
        chunk_ranges(4, 2, 0)


def test_a_chunk_is_named_by_its_content_wherever_it_sits() -> None:
    frames = clip_frames(11, 64, 48)

    whole = chunk_hashes(frames, PLAN, 2, model_id="m", fingerprint="f")
    later = chunk_hashes(frames[4:], PLAN, 2, model_id="m", fingerprint="f")

    assert [(c.num_patches, c.frames) for c in whole] == [
        (2, range(0, 4)),
        (2, range(4, 8)),
        (2, range(8, 11)),
    ]
    assert len({chunk.content_hash for chunk in whole}) == 3
    assert later[0].content_hash == whole[1].content_hash
    assert later[1].frames == range(4, 7)
    assert later[1].content_hash == whole[2].content_hash  # frames 8-10 of both, padded alike
    resized = chunk_hashes(
        frames, replace(PLAN, resized=(28, 28)), 2, model_id="m", fingerprint="f"
    )
    assert all(a.content_hash != b.content_hash for a, b in zip(whole, resized, strict=True))


def test_the_video_processors_own_file_changes_the_fingerprint(
    tiny_family_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_family_dir("qwen3_vl"), model_dir)
    before = video_processor_fingerprint(model_dir)
    path = model_dir / "video_preprocessor_config.json"
    settings = json.loads(path.read_text())
    settings["fps"] = 1.0
    path.write_text(json.dumps(settings))
    assert video_processor_fingerprint(model_dir) != before


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_the_planner_decodes_plans_and_names_a_video(
    family: str, tiny_family_dir: Callable[[str], Path]
) -> None:
    planner = VideoPlanner(tiny_family_dir(family), "tiny")
    mp4 = make_clip("mp4", num_frames=30, fps=10)
    mkv = remux(mp4, "matroska")

    video = planner.load(mp4, POLICY)

    assert video.stream.num_frames == 30
    assert video.frames.shape == (len(video.plan.frame_indices), 48, 64, 3)
    assert video.plan.num_tokens > 0
    assert planner.load(mkv, POLICY).video_hash == video.video_hash
    reversed_clip = make_clip(frames=clip_frames(30, 64, 48)[::-1].copy(), fps=10)
    assert planner.load(reversed_clip, POLICY).video_hash != video.video_hash
    chunks = planner.chunks(video, 1)
    assert sum(chunk.num_patches for chunk in chunks) == video.plan.grid[0]
    pixels, grid = planner.pixel_inputs(
        video.frames[chunks[0].frames.start : chunks[0].frames.stop], video.plan
    )
    assert grid.tolist() == [[1, *video.plan.grid[1:]]]


def test_a_family_without_video_is_refused_with_a_clear_error(
    tiny_family_dir: Callable[[str], Path],
) -> None:
    planner = VideoPlanner(tiny_family_dir("llava"), "tiny")
    with pytest.raises(InvalidArgument) as refused:
        planner.load(make_clip(num_frames=6), POLICY)
    assert refused.value.reason == "VIDEO_NOT_SUPPORTED"
    assert "LLaVA-1.5 models do not take video" in refused.value.message
