"""The transformers engine's raw video (EPD): the route's kept frames resized to the plan's size by
the family's own video processor, whatever sampling chose them (a request's fps override keeps
other frames than the checkpoint's settings, and for Qwen3-VL another pixel budget)."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage, VideoFrames
from epd.server.engine.transformers_tower import video_pixel_inputs
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_overrides import VideoOverrides
from epd.server.media.video_planner import PlannedVideo, VideoPlanner
from tests.unit.models.clips import make_clip

CLIP = make_clip(num_frames=16, width=64, height=48, fps=2)


def raw(video: PlannedVideo, resized: tuple[int, int] | None) -> EngineImage:
    stream, plan = video.stream, video.plan
    frames = VideoFrames(video.frames, stream.fps, stream.num_frames, plan.frame_indices, resized)
    return EngineImage(video.video_hash, plan.grid, seconds_per_temporal_patch=0.0, frames=frames)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_frames_sampled_under_an_override_give_the_route_s_grid(tiny_family_dir, family) -> None:
    planner = VideoPlanner(tiny_family_dir(family), "tiny")
    default = planner.load(CLIP, MediaPolicy())
    video = planner.load(CLIP, MediaPolicy(), VideoOverrides(fps=0.5))
    assert len(video.frames) < len(default.frames), "the override keeps fewer frames"
    pixel_values, grid = video_pixel_inputs(
        planner.family, planner.processor, planner.config, raw(video, video.plan.resized)
    )
    expected = planner.family.video_pixel_inputs(
        planner.processor, video.frames, video.plan.resized, None, planner.config
    )
    assert tuple(grid[0].tolist()) == video.plan.grid
    assert pixel_values.equal(expected[0])


def test_frames_without_the_plan_s_size_or_at_another_are_refused(tiny_family_dir) -> None:
    planner = VideoPlanner(tiny_family_dir("qwen2_vl"), "tiny")
    video = planner.load(CLIP, MediaPolicy())
    height, width = video.plan.resized
    cases = {None: "BAD_VIDEO_SPAN", (height * 2, width): "BAD_VIDEO_PLAN"}
    for resized, reason in cases.items():
        with pytest.raises(InvalidArgument) as caught:
            video_pixel_inputs(
                planner.family, planner.processor, planner.config, raw(video, resized)
            )
        assert caught.value.reason == reason
