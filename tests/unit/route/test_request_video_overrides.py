"""A request's mm_processor_kwargs and media_io_kwargs at the route: checked in every request
(refused as vLLM refuses them without --trust-request-mm-kwargs, videos or not), and applied to
each video's plan, which the chunks the encoders get carry (frames kept, size)."""

from __future__ import annotations

import asyncio
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import MediaKwargs
from epd.server.media.video_planner import VideoPlanner
from epd.server.route.media import RouteVideo, load_videos
from epd.server.route.request import ImageSource
from tests.unit.models.clips import make_clip

CLIP = ImageSource(data=make_clip(num_frames=24, width=64, height=48, fps=8))
# NOTE: the tiny model is Qwen2-VL, whose video placeholder expands to the video's rows
ROWS = attrgetter("num_tokens")


def load(videos: VideoLoader, *args: Any, **kwargs: Any) -> list[RouteVideo]:
    """``load_videos`` run to its end."""
    return asyncio.run(load_videos(videos, *args, video_tokens=ROWS, **kwargs))


def loader(model_dir: Path, trusted: bool) -> VideoLoader:
    policy = MediaPolicy(trust_request_mm_kwargs=trusted)
    return VideoLoader(VideoPlanner(model_dir, "tiny"), policy)


def test_the_requests_override_reaches_the_chunks(tiny_model_dir: Path) -> None:
    videos = loader(tiny_model_dir, trusted=True)
    default = load(videos, [CLIP], 1)[0]
    kwargs = MediaKwargs({"fps": 1, "min_pixels": 12544}, None)
    slow = load(videos, [CLIP], 1, kwargs)[0]

    assert len(slow.items) < len(default.items)
    span = slow.items[0].video
    assert (span.resized_height, span.resized_width) == slow.video.plan.resized
    assert span.resized_height * span.resized_width >= 12544
    assert slow.items[0].mm_hash not in {item.mm_hash for item in default.items}


@pytest.mark.parametrize("sources", [[], [CLIP]], ids=["text", "video"])
def test_untrusted_kwargs_are_refused_with_or_without_a_video(
    tiny_model_dir: Path, sources: list[ImageSource]
) -> None:
    videos = loader(tiny_model_dir, trusted=False)
    with pytest.raises(InvalidArgument) as caught:
        load(videos, sources, 1, MediaKwargs(None, {"video": {"fps": 1}}))
    assert caught.value.metadata["param"] == "media_io_kwargs"
    assert "--trust-request-mm-kwargs" in str(caught.value)


def test_a_pixel_budget_beside_an_image_reaches_the_video_and_other_image_keys_are_refused(
    tiny_model_dir: Path,
) -> None:
    videos = loader(tiny_model_dir, trusted=True)
    kwargs = MediaKwargs({"max_pixels": 6272}, None)
    (budgeted,) = load(videos, [CLIP], 1, kwargs, has_images=True)
    assert budgeted.video.overrides.max_pixels == 6272
    other = MediaKwargs({"images_kwargs": {"resample": 2}}, None)
    with pytest.raises(InvalidArgument) as caught:
        load(videos, [CLIP], 1, other, has_images=True)
    assert caught.value.reason == "MEDIA_KWARGS_NOT_SUPPORTED"


def test_a_pixel_budget_needs_encoders_and_a_sampling_override_does_not(
    tiny_model_dir: Path,
) -> None:
    from epd.server.route.media import stage_items

    videos = loader(tiny_model_dir, trusted=True)
    pixels = MediaKwargs({"max_pixels": 6272}, None)
    budgeted = load(videos, [CLIP], 1, pixels)
    assert stage_items(True, [], budgeted)[0] == budgeted[0].items
    with pytest.raises(InvalidArgument) as caught:
        stage_items(False, [], budgeted)
    assert caught.value.reason == "MEDIA_KWARGS_NOT_SUPPORTED"
    sampled = load(videos, [CLIP], 1, MediaKwargs({"fps": 1}, None))
    assert len(stage_items(False, [], sampled)[0]) == 1


def test_the_openai_body_carries_both_fields_and_vllm_checks_their_types() -> None:
    from epd.server.route.openai_schema import to_chat_request

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "mm_processor_kwargs": {"fps": 1},
        "media_io_kwargs": {"video": {"num_frames": 16}},
    }
    request = to_chat_request(body, "tiny")
    assert request.media_kwargs == MediaKwargs({"fps": 1}, {"video": {"num_frames": 16}})
    with pytest.raises(InvalidArgument) as caught:
        to_chat_request({**body, "media_io_kwargs": {"video": 3}}, "tiny")
    assert caught.value.metadata["param"].startswith("media_io_kwargs")


def test_a_grpc_request_carries_both_fields_as_json_objects(tiny_model_dir: Path) -> None:
    from google.protobuf import struct_pb2

    from epd.server.route.request import from_proto
    from epd.v1 import route_service_pb2

    processor, io = struct_pb2.Struct(), struct_pb2.Struct()
    processor.update({"fps": 1, "videos_kwargs": {"max_pixels": 6272}})
    io.update({"video": {"num_frames": 16}})
    request = route_service_pb2.GenerateRequest(mm_processor_kwargs=processor, media_io_kwargs=io)
    kwargs = from_proto(request).media_kwargs
    expected = {"fps": 1, "videos_kwargs": {"max_pixels": 6272}}
    assert kwargs == MediaKwargs(expected, {"video": {"num_frames": 16}})
    assert from_proto(route_service_pb2.GenerateRequest()).media_kwargs == MediaKwargs()
    # NOTE: a Struct's numbers are floats; 16.0 frames is 16
    io.update({"video": {"num_frames": 16, "max_frames": 20}})
    request = route_service_pb2.GenerateRequest(media_io_kwargs=io)
    overrides = loader(tiny_model_dir, trusted=True).overrides(
        from_proto(request).media_kwargs, has_images=False
    )
    assert (overrides.num_frames, overrides.max_frames) == (16, 20)
    assert isinstance(overrides.num_frames, int)


def test_the_sdk_sends_both_fields_typed(tiny_model_dir: Path) -> None:
    from epd.client.messages import build_request, user
    from epd.server.route.request import from_proto

    processor = {"fps": 1, "videos_kwargs": {"max_pixels": 6272}}
    io = {"video": {"num_frames": 16}}
    request = build_request(
        [user("what happens?")], mm_processor_kwargs=processor, media_io_kwargs=io
    )
    assert from_proto(request).media_kwargs == MediaKwargs(processor, io)
    assert from_proto(build_request([user("hi")])).media_kwargs == MediaKwargs()
