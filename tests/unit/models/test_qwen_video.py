"""The Qwen families plan a video exactly as their transformers processors process it: the same
frames kept, grid, pixel values, placeholder count, Qwen2.5-VL's seconds per temporal patch and
Qwen3-VL's timestamps, given the same decoded frames; other families refuse video by name."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from epd.server.media.policy import MediaPolicy
from epd.server.media.video import decode_video
from epd.server.models.registry import family_named, family_of
from epd.server.models.video import VideoClip, VideoPlan, VideoRefused
from tests.unit.models.clips import make_clip

QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# (frames, fps, width, height): a short clip, an odd sampled count, a long clip, a wide one
CLIPS = [(37, 12, 160, 120), (23, 7, 96, 64), (90, 30, 128, 96), (20, 10, 224, 48)]


def decoded(num_frames: int, fps: int, width: int, height: int) -> tuple[np.ndarray, VideoClip]:
    data = make_clip(num_frames=num_frames, fps=fps, width=width, height=height)
    video = decode_video(data, MediaPolicy(), lambda stream: range(stream.num_frames))
    stream = video.stream
    return video.frames, VideoClip(stream.num_frames, stream.fps, stream.width, stream.height)


def reference(processor: Any, frames: np.ndarray, clip: VideoClip) -> Any:
    """transformers' video processor sampling and processing every decoded frame itself."""
    from transformers.video_utils import VideoMetadata

    metadata = VideoMetadata(total_num_frames=clip.num_frames, fps=clip.fps)
    return processor(
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=True,
        return_metadata=True,
        return_tensors="pt",
    )


def video_processor(model_dir: Path, **changes: Any) -> Any:
    from transformers import AutoVideoProcessor

    return AutoVideoProcessor.from_pretrained(model_dir, **changes)


def plan_of(model_dir: Path, processor: Any, clip: VideoClip) -> VideoPlan:
    return family_of(model_dir).plan_video(clip, None, processor)


@pytest.mark.parametrize("family", QWEN)
@pytest.mark.parametrize("cap", [None, True])
@pytest.mark.parametrize("shape", CLIPS, ids=lambda shape: "x".join(map(str, shape)))
def test_the_plan_and_pixels_are_the_processors(
    family: str, cap: bool | None, shape: tuple[int, ...], tiny_family_dir: Callable[[str], Path]
) -> None:
    model_dir = tiny_family_dir(family)
    processor = video_processor(model_dir, cap_pixels_per_frame=cap)
    frames, clip = decoded(*shape)
    expected = reference(processor, frames, clip)

    plan = plan_of(model_dir, processor, clip)
    kept = frames[list(plan.frame_indices)]
    pixels, grid = family_of(model_dir).video_pixel_inputs(processor, kept, plan.resized)

    assert list(plan.frame_indices) == [
        int(i) for i in expected["video_metadata"][0].frames_indices
    ]
    assert [list(plan.grid)] == expected["video_grid_thw"].tolist() == grid.tolist()
    assert torch.equal(pixels, expected["pixel_values_videos"])
    assert plan.num_tokens == pixels.shape[0] // 4
    assert plan.resized[0] // int(processor.patch_size) == plan.grid[1]


@pytest.mark.parametrize("family", QWEN)
@pytest.mark.parametrize("patches_per_chunk", [1, 2])
def test_chunks_cut_at_temporal_patches_give_the_whole_clips_rows(
    family: str, patches_per_chunk: int, tiny_family_dir: Callable[[str], Path]
) -> None:
    model_dir = tiny_family_dir(family)
    processor, kin = video_processor(model_dir), family_named(family)
    frames, clip = decoded(45, 5, 96, 64)
    plan = plan_of(model_dir, processor, clip)
    kept = frames[: 2 * 4 + 1]  # an odd count: the last temporal patch repeats its frame
    whole, whole_grid = kin.video_pixel_inputs(processor, kept, plan.resized)

    step = plan.temporal_patch_size * patches_per_chunk
    parts = [
        kin.video_pixel_inputs(processor, kept[start : start + step], plan.resized)
        for start in range(0, len(kept), step)
    ]

    assert torch.equal(torch.cat([pixels for pixels, _ in parts]), whole)
    assert sum(int(grid[0, 0]) for _, grid in parts) == int(whole_grid[0, 0]) == 5


@pytest.mark.parametrize("family", QWEN)
def test_the_prompt_facts_are_the_processors(
    family: str, tiny_family_dir: Callable[[str], Path]
) -> None:
    from transformers import AutoProcessor
    from transformers.video_utils import VideoMetadata

    model_dir = tiny_family_dir(family)
    processor = AutoProcessor.from_pretrained(model_dir)
    frames, clip = decoded(37, 12, 160, 120)
    plan = plan_of(model_dir, processor.video_processor, clip)
    chat = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what"}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    metadata = VideoMetadata(total_num_frames=clip.num_frames, fps=clip.fps)
    inputs = processor(text=[text], videos=[frames], video_metadata=[metadata], return_tensors="pt")
    prompt = processor.tokenizer.decode(inputs["input_ids"][0])

    assert prompt.count("<|video_pad|>") == plan.num_tokens
    if family == "qwen2_5_vl":
        assert inputs["second_per_grid_ts"].tolist() == pytest.approx(
            [plan.seconds_per_temporal_patch]
        )
    else:
        assert plan.seconds_per_temporal_patch is None
    if family == "qwen3_vl":
        assert plan.timestamps is not None and len(plan.timestamps) == plan.grid[0]
        shown = [f"<{second:.1f} seconds>" for second in plan.timestamps]
        assert all(stamp in prompt for stamp in shown)
        assert prompt.index(shown[0]) < prompt.index(shown[-1])
    else:
        assert plan.timestamps is None


@pytest.mark.parametrize("family", ["llava", "internvl"])
def test_a_family_without_video_refuses_it_by_name(family: str) -> None:
    kin = family_named(family)
    with pytest.raises(VideoRefused, match=f"{kin.title} models do not take video") as refused:
        kin.plan_video(VideoClip(10, 10.0, 64, 48), None, None)
    assert refused.value.reason == "VIDEO_NOT_SUPPORTED"
    with pytest.raises(VideoRefused):
        kin.video_pixel_inputs(None, np.zeros((2, 48, 64, 3), np.uint8), (28, 28))


def test_a_clip_too_short_for_a_fixed_frame_count_is_refused(
    tiny_family_dir: Callable[[str], Path],
) -> None:
    model_dir = tiny_family_dir("qwen2_vl")
    processor = video_processor(model_dir, num_frames=8, fps=None)
    with pytest.raises(VideoRefused) as refused:
        plan_of(model_dir, processor, VideoClip(4, 10.0, 64, 48))
    assert refused.value.reason == "VIDEO_TOO_SHORT"


def test_an_aspect_ratio_beyond_the_rule_is_refused(
    tiny_family_dir: Callable[[str], Path],
) -> None:
    model_dir = tiny_family_dir("qwen2_vl")
    with pytest.raises(VideoRefused) as refused:
        plan_of(model_dir, video_processor(model_dir), VideoClip(10, 10.0, 4020, 20))
    assert refused.value.reason == "BAD_VIDEO_SHAPE"


def test_sampling_follows_the_checkpoints_settings(
    tiny_family_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    model_dir = tmp_path / "qwen2_vl"
    shutil.copytree(tiny_family_dir("qwen2_vl"), model_dir)
    config = model_dir / "processor_config.json"
    settings = json.loads(config.read_text())
    settings["video_processor"].update(fps=1.0, max_frames=6)
    config.write_text(json.dumps(settings))
    clip = VideoClip(200, 10.0, 64, 48)

    plan = plan_of(model_dir, video_processor(model_dir), clip)

    assert plan.sampling == "fps=1.0 max_frames=6 min_frames=4"
    assert len(plan.frame_indices) == 6
