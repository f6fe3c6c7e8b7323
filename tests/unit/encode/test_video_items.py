"""An encoder that cannot read the route's frames of a video chunk decodes the video's source
and plans it as the route did, under the settings the route planned it with (a request's or
the route's ``mm_processor_kwargs``), so the chunk's frames and hash are the route's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from epd.common.errors import InvalidArgument
from epd.server.encode.video_items import VideoSpan, frames_from_source
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import VideoOverrides
from epd.server.media.video_planner import VideoPlanner
from epd.v1 import multimodal_pb2
from tests.unit.models.clips import make_clip

CLIP = make_clip(num_frames=8, width=64, height=48, fps=1)


@pytest.fixture(scope="module")
def loader(tiny_model_dir: Path) -> VideoLoader:
    return VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), MediaPolicy(), cache_items=0)


def span_of(chunk_frames: range, resized: tuple[int, int], settings: str) -> VideoSpan:
    """The encoder's span of the route's ``VideoSpan`` message."""
    message = multimodal_pb2.VideoSpan(
        first_frame=chunk_frames.start,
        num_frames=len(chunk_frames),
        resized_height=resized[0],
        resized_width=resized[1],
        video_settings=settings,
    )
    return VideoSpan.from_proto(message)


async def test_a_chunk_of_a_video_planned_under_an_override_is_found_in_its_source(
    loader: VideoLoader,
) -> None:
    video = await loader.load(data=CLIP, overrides=VideoOverrides(fps=0.5))
    default = await loader.load(data=CLIP)
    assert len(video.frames) != len(default.frames)
    chunk = loader.planner.chunks(video, 1)[-1]
    span = span_of(chunk.frames, video.plan.resized, video.overrides.key)

    frames = await frames_from_source(loader, "", CLIP, span, chunk.content_hash)

    assert np.array_equal(frames, video.frames[chunk.frames.start : chunk.frames.stop])
    without = span_of(chunk.frames, video.plan.resized, "")
    with pytest.raises(InvalidArgument) as caught:
        await frames_from_source(loader, "", CLIP, without, chunk.content_hash)
    assert caught.value.reason == "MM_HASH_MISMATCH"


@pytest.mark.parametrize("settings", ["{", "[1]", '{"fps": "fast"}', '{"colour": 1}', '{"fps":1}'])
def test_settings_that_are_not_canonical_video_settings_are_refused(settings: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        span_of(range(0, 2), (56, 84), settings)
    assert caught.value.reason == "BAD_VIDEO_SPAN"
