"""A request's images and videos for an encode_prefill worker, whose engine runs its own vision
tower (EPD, EP/D; no encoder live): raw, with the pixels the route decoded (no grpc).

Each image goes as its item (source, mm_hash, the route's shared pixels). Each video goes whole,
not cut into chunks: one item named by the video's hash, whose shared pixels are all its kept
frames (one lease), and the plan that shaped the prompt (grid, timing, the kept frames' indices),
so the worker's engine takes the frames as they are, neither decoded nor sampled again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from epd.server.media.hashing import salted
from epd.server.route.media import RouteImage, RouteVideo, pixels_of
from epd.v1 import generation_pb2, multimodal_pb2


def whole_video_item(video: RouteVideo) -> multimodal_pb2.MediaItem:
    """The item of the whole ``video``: its source, its hash (salted as its chunks are, with
    their ``key_salt``), a span of every kept frame at the plan's size."""
    first = video.items[0]
    salt = first.key_salt
    height, width = video.video.plan.resized
    span = multimodal_pb2.VideoSpan(
        num_frames=len(video.video.frames),
        resized_height=height,
        resized_width=width,
        video_settings=video.video.overrides.key,
    )
    item = multimodal_pb2.MediaItem(
        mm_hash=salted(video.video.video_hash, salt), key_salt=salt, video=span
    )
    if first.WhichOneof("source") == "url":
        item.url = first.url
    else:
        item.data = first.data
    return item


def stage_items(
    uses_encoders: bool, images: list[RouteImage], videos: list[RouteVideo]
) -> tuple[list[multimodal_pb2.MediaItem], Iterator[tuple[multimodal_pb2.MediaItem, np.ndarray]]]:
    """A request's items and, lazily, each one's decoded pixels to share: with encoders, its
    images and its videos' chunks (``media.pixels_of``); else its images and each video's
    ``whole_video_item`` with all its kept frames."""
    image_items = [image.item for image in images]
    if uses_encoders:
        chunk_items = [item for video in videos for item in video.items]
        return image_items + chunk_items, pixels_of(images, videos)
    for video in videos:
        video.video.check_whole()
    video_items = [whole_video_item(video) for video in videos]
    return image_items + video_items, _raw_pixels(images, videos, video_items)


def _raw_pixels(
    images: Sequence[RouteImage],
    videos: Sequence[RouteVideo],
    video_items: Sequence[multimodal_pb2.MediaItem],
) -> Iterator[tuple[multimodal_pb2.MediaItem, np.ndarray]]:
    for image in images:
        yield image.item, image.loaded.pixels
    for video, item in zip(videos, video_items, strict=True):
        yield item, video.video.frames


def raw_prompt(
    token_ids: Sequence[int],
    images: Sequence[RouteImage],
    videos: Sequence[RouteVideo],
    video_items: Sequence[multimodal_pb2.MediaItem],
) -> generation_pb2.Prompt:
    """The prompt with raw images and videos (``video_items``: each video's
    ``whole_video_item``, as ``stage_items`` made them)."""
    inputs = [multimodal_pb2.ImageInput(mm_hash=i.item.mm_hash, media=i.item) for i in images]
    raw_videos = [raw_video_input(v, i) for v, i in zip(videos, video_items, strict=True)]
    return generation_pb2.Prompt(token_ids=token_ids, images=inputs, videos=raw_videos)


def raw_video_input(video: RouteVideo, item: multimodal_pb2.MediaItem) -> multimodal_pb2.VideoInput:
    """The encode_prefill worker's input for ``video`` (``item``: its ``whole_video_item``)."""
    plan, stream = video.video.plan, video.video.stream
    t, h, w = plan.grid
    return multimodal_pb2.VideoInput(
        mm_hash=item.mm_hash,
        grid=multimodal_pb2.ImageGrid(t=t, h=h, w=w),
        seconds_per_temporal_patch=plan.seconds_per_temporal_patch or 0.0,
        timestamps=plan.timestamps or (),
        media=item,
        fps=stream.fps,
        num_decoded_frames=stream.num_frames,
        frame_indices=plan.frame_indices,
    )
