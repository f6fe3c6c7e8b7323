"""An encode_prefill worker takes a raw video (EPD, EP/D) as the route's kept frames, shared in a
segment tagged with the video's mm_hash, and the route's plan in the message: nothing decoded or
hashed again. Frames tagged as anything else, released or on another host are ignored and the
source is decoded and planned here, which must give the video's mm_hash; a worker that takes
embeddings only refuses raw videos."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from epd.common.errors import FailedPrecondition, InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.media.hashing import pixels_tag, salted
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import VideoOverrides
from epd.server.media.video_planner import PlannedVideo, VideoPlanner
from epd.server.transfer.plane import DataPlane
from epd.server.worker.images import ImageResolver
from epd.v1 import multimodal_pb2
from tests.unit.models.clips import make_clip

CLIP = make_clip(num_frames=8, width=64, height=48, fps=1)
OTHER_CLIP = make_clip(num_frames=8, width=64, height=48, fps=2)


@pytest.fixture(scope="module")
def planner(tiny_model_dir) -> VideoPlanner:
    return VideoPlanner(tiny_model_dir, "tiny")


@pytest.fixture
def route() -> Iterator[DataPlane]:
    plane = DataPlane("host-a", kinds=("shm",))
    yield plane
    plane.close()


def raw_input(
    video: PlannedVideo, source: bytes, pixels: object = None, salt: str = ""
) -> multimodal_pb2.VideoInput:
    """The route's message for ``video`` (its source ``source``, its frames at ``pixels``)."""
    t, h, w = video.plan.grid
    mm_hash = salted(video.video_hash, salt)
    height, width = video.plan.resized
    span = multimodal_pb2.VideoSpan(
        num_frames=len(video.frames),
        resized_height=height,
        resized_width=width,
        video_settings=video.overrides.key,
    )
    media = multimodal_pb2.MediaItem(mm_hash=mm_hash, data=source, key_salt=salt, video=span)
    if pixels is not None:
        media.pixels.CopyFrom(pixels)
    return multimodal_pb2.VideoInput(
        mm_hash=mm_hash,
        grid=multimodal_pb2.ImageGrid(t=t, h=h, w=w),
        seconds_per_temporal_patch=video.plan.seconds_per_temporal_patch or 0.0,
        timestamps=video.plan.timestamps or (),
        media=media,
        fps=video.stream.fps,
        num_decoded_frames=video.stream.num_frames,
        frame_indices=video.plan.frame_indices,
    )


async def resolve(
    planner: VideoPlanner, message: multimodal_pb2.VideoInput, host_id: str = "host-a"
) -> tuple[EngineImage, VideoLoader]:
    """What an encode_prefill worker on ``host_id`` makes of ``message``, and its loader."""
    worker = DataPlane(host_id, kinds=("shm",))
    videos = VideoLoader(planner, MediaPolicy(), cache_items=0)
    try:
        images = ImageResolver(worker, object(), videos=videos)  # type: ignore[arg-type]
        (video,) = await images.resolve([], [message])
    finally:
        worker.close()
    return video, videos


def assert_is_the_planned_video(resolved: EngineImage, video: PlannedVideo, name: str) -> None:
    frames = resolved.frames
    assert frames is not None and resolved.is_video and resolved.is_raw
    assert np.array_equal(frames.pixels, video.frames)
    assert (frames.fps, frames.num_decoded_frames) == (video.stream.fps, video.stream.num_frames)
    assert (frames.frame_indices, frames.resized) == (video.plan.frame_indices, video.plan.resized)
    assert (resolved.mm_hash, resolved.grid) == (name, video.plan.grid)
    assert resolved.seconds_per_temporal_patch == (video.plan.seconds_per_temporal_patch or 0.0)


async def test_the_route_s_tagged_frames_are_taken_as_the_video(
    planner: VideoPlanner, route: DataPlane
) -> None:
    video = planner.load(CLIP, MediaPolicy())
    ref = route.put(
        torch.from_numpy(video.frames), "host-a", content_tag=pixels_tag(video.video_hash)
    )
    resolved, videos = await resolve(planner, raw_input(video, b"not a video", ref))
    assert_is_the_planned_video(resolved, video, video.video_hash)
    assert videos.num_decoded == 0, "neither decoded nor planned again"
    route.release([ref.lease_id])


@pytest.mark.parametrize("case", ["other tag", "released", "other host", "none shared"])
async def test_frames_not_bound_to_the_video_here_are_ignored_for_the_source(
    planner: VideoPlanner, route: DataPlane, case: str
) -> None:
    video = planner.load(CLIP, MediaPolicy())
    name = salted(video.video_hash, "tenant")
    wrong = np.zeros_like(video.frames)
    tag = pixels_tag("0" * 32 if case == "other tag" else name)
    ref = route.put(torch.from_numpy(wrong), "host-a", content_tag=tag)
    if case == "released":
        route.release([ref.lease_id])
    message = raw_input(video, CLIP, None if case == "none shared" else ref, salt="tenant")
    host_id = "host-b" if case == "other host" else "host-a"
    resolved, videos = await resolve(planner, message, host_id)
    assert_is_the_planned_video(resolved, video, name)
    assert videos.num_decoded == 1
    route.release([ref.lease_id])


async def test_the_source_is_planned_under_the_settings_the_route_planned_it_with(
    planner: VideoPlanner,
) -> None:
    video = planner.load(CLIP, MediaPolicy(), VideoOverrides(fps=0.5))
    assert len(video.frames) == 4, "the override keeps every other frame"
    resolved, videos = await resolve(planner, raw_input(video, CLIP))
    assert_is_the_planned_video(resolved, video, video.video_hash)
    assert videos.num_decoded == 1


async def test_a_source_that_is_another_video_is_refused(planner: VideoPlanner) -> None:
    message = raw_input(planner.load(CLIP, MediaPolicy()), OTHER_CLIP)
    with pytest.raises(InvalidArgument) as caught:
        await resolve(planner, message)
    assert caught.value.reason == "MM_HASH_MISMATCH"


async def test_a_worker_that_takes_embeddings_refuses_raw_videos(planner: VideoPlanner) -> None:
    message = raw_input(planner.load(CLIP, MediaPolicy()), CLIP)
    plane = DataPlane("host-a", kinds=("shm",))
    try:
        with pytest.raises(FailedPrecondition) as caught:
            await ImageResolver(plane).resolve([], [message])
    finally:
        plane.close()
    assert caught.value.reason == "RAW_VIDEOS_UNSUPPORTED"
