"""What the route hands an encode_prefill worker for a video (EPD, EP/D): the whole video as one
item named by the video's hash (salted as its chunks, for a tenant), its source, a span of every
kept frame at the plan's size, the kept frames as that item's pixels, and the plan in the
VideoInput; with encoders, each chunk's item shares the chunk's own frames."""

from __future__ import annotations

import asyncio
import base64
from operator import attrgetter
from pathlib import Path

import numpy as np

from epd.server.media.hashing import salted
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import VideoPlanner
from epd.server.route.media import load_video, raw_prompt, stage_items
from epd.server.route.request import ImageSource
from tests.unit.models.clips import make_clip

CLIP = make_clip(num_frames=8, width=64, height=48, fps=1)
# NOTE: the tiny model is Qwen2-VL, whose video placeholder expands to the video's rows
ROWS = attrgetter("num_tokens")


def test_a_video_goes_whole_with_its_frames_and_plan(tiny_model_dir: Path) -> None:
    loader = VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), MediaPolicy())
    video = asyncio.run(load_video(loader, ImageSource(data=CLIP), 1, ROWS))
    assert len(video.items) == 4, "four chunks of one temporal patch"
    for item in video.items:  # NOTE: a tenant's request (router.in_namespace)
        item.mm_hash, item.key_salt = salted(item.mm_hash, "tenant"), "tenant"
    items, pixels = stage_items(False, [], [video])
    (item,) = items
    planned = video.video
    assert (item.mm_hash, item.key_salt) == (salted(planned.video_hash, "tenant"), "tenant")
    assert (item.data, item.video.first_frame, item.video.num_frames) == (CLIP, 0, 8)
    assert (item.video.resized_height, item.video.resized_width) == planned.plan.resized
    ((shared_item, frames),) = list(pixels)
    assert shared_item is item and np.array_equal(frames, planned.frames)
    prompt = raw_prompt([1, 2], [], [video], items)
    (message,) = prompt.videos
    assert message.mm_hash == item.mm_hash and message.media == item and not message.chunks
    assert (message.grid.t, message.grid.h, message.grid.w) == planned.plan.grid
    assert (message.fps, message.num_decoded_frames) == (planned.stream.fps, 8)
    assert tuple(message.frame_indices) == planned.plan.frame_indices
    assert list(prompt.token_ids) == [1, 2] and not prompt.images


def test_a_video_at_a_url_goes_by_its_url(tiny_model_dir: Path) -> None:
    loader = VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), MediaPolicy())
    url = "data:video/mp4;base64," + base64.b64encode(CLIP).decode()
    video = asyncio.run(load_video(loader, ImageSource(url=url), 2, ROWS))
    (item,), _ = stage_items(False, [], [video])
    assert (item.WhichOneof("source"), item.url) == ("url", url)
    assert item.mm_hash == video.video.video_hash and not item.key_salt


def test_with_encoders_each_chunk_shares_its_own_kept_frames(tiny_model_dir: Path) -> None:
    loader = VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), MediaPolicy())
    video = asyncio.run(load_video(loader, ImageSource(data=CLIP), 1, ROWS))
    items, pixels = stage_items(True, [], [video])
    assert items == video.items and [item for item, _ in pixels] == items
    for chunk, (_, frames) in zip(video.chunks, pixels, strict=True):
        assert np.array_equal(frames, video.video.frames[chunk.frames.start : chunk.frames.stop])
    assert sum(len(frames) for _, frames in pixels) == len(video.video.frames)
