"""A video in a request, through both doors, the checks, the prompt and the SDK (no server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from epd.client.messages import build_request, user
from epd.common.errors import InvalidArgument
from epd.server.route.openai_schema import to_chat_request
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ImageSource, from_proto
from epd.server.route.request_check import RequestLimits, check_request
from epd.v1 import multimodal_pb2, route_service_pb2, tensor_pb2

VIDEO_URL = "data:video/mp4;base64,AAAA"


def body(*parts: dict[str, object]) -> dict[str, object]:
    return {"model": "tiny", "messages": [{"role": "user", "content": list(parts)}]}


def test_openai_video_url_parts_keep_their_order_among_images() -> None:
    request = to_chat_request(
        body(
            {"type": "video_url", "video_url": {"url": VIDEO_URL}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "video_url", "video_url": {"url": "https://example.com/b.mp4"}},
            {"type": "text", "text": "what happens?"},
        ),
        "tiny",
    )
    parts = request.messages[0].parts
    assert [p.video.url if p.video else p.image.url if p.image else p.text for p in parts] == [
        VIDEO_URL,
        "https://example.com/a.png",
        "https://example.com/b.mp4",
        "what happens?",
    ]
    assert [v.url for v in request.videos] == [VIDEO_URL, "https://example.com/b.mp4"]


def test_a_video_url_part_without_a_url_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument) as caught:
        to_chat_request(body({"type": "video_url", "video_url": {}}), "tiny")
    assert caught.value.metadata["param"] == "messages[0].content[0].video_url"


def test_grpc_video_parts_become_videos_and_empty_ones_are_refused() -> None:
    def grpc_request(item: multimodal_pb2.MediaItem) -> route_service_pb2.GenerateRequest:
        content = [route_service_pb2.ContentPart(video=item)]
        message = route_service_pb2.ChatMessage(role="user", content=content)
        return route_service_pb2.GenerateRequest(request_id="r", messages=[message])

    request = from_proto(grpc_request(multimodal_pb2.MediaItem(data=b"clip")))
    assert request.videos == [ImageSource(data=b"clip")] and request.images == []
    empty = from_proto(grpc_request(multimodal_pb2.MediaItem()))
    with pytest.raises(InvalidArgument) as caught:
        check_request(empty, RequestLimits())
    assert caught.value.reason == "BAD_MEDIA_ITEM"
    assert caught.value.metadata["param"] == "messages[0].content[0].video"


@pytest.mark.parametrize("field", ["pixels", "video"])
def test_a_clients_video_item_may_not_name_what_only_the_route_sets(field: str) -> None:
    item = multimodal_pb2.MediaItem(data=b"clip")
    if field == "pixels":
        item.pixels.CopyFrom(tensor_pb2.TensorRef(byte_size=1))
    else:
        item.video.CopyFrom(multimodal_pb2.VideoSpan(num_frames=2))
    content = [route_service_pb2.ContentPart(video=item)]
    message = route_service_pb2.ChatMessage(role="user", content=content)
    with pytest.raises(InvalidArgument) as caught:
        from_proto(route_service_pb2.GenerateRequest(request_id="r", messages=[message]))
    assert caught.value.metadata["param"] == f"messages[0].content[0].video.{field}"


def test_the_prompt_holds_one_video_placeholder_per_video(tiny_model_dir: Path) -> None:
    builder = PromptBuilder(tiny_model_dir)
    video = ChatPart(video=ImageSource(data=b"clip"))
    image = ChatPart(image=ImageSource(data=b"png"))
    ids = builder.token_ids([ChatMessage("user", [video, image, video, ChatPart(text="?")])])
    assert builder.video_pad_id is not None
    assert ids.count(builder.video_pad_id) == 2 and ids.count(builder.image_pad_id) == 1
    # the video's hash and token count shape the block hashes, as an image's do
    padded = ids + [7] * 32
    hashes = builder.block_hashes(padded, [("aa", 4)], [("bb", 8), ("cc", 8)])
    assert hashes == builder.block_hashes(padded, [("aa", 4)], [("bb", 8), ("cc", 8)])
    assert hashes != builder.block_hashes(padded, [("aa", 4)], [("bb", 8), ("dd", 8)])


def test_the_sdk_sends_videos_after_images_in_order(tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"mp4 bytes")
    request = build_request([user("what?", image=b"png", videos=[clip, "https://x/v.webm"])])
    parts = request.messages[0].content
    assert [p.WhichOneof("part") for p in parts] == ["image", "video", "video", "text"]
    assert parts[1].video.data == b"mp4 bytes" and parts[2].video.url == "https://x/v.webm"


async def test_the_route_refuses_videos_over_the_token_limit_before_any_encoder(
    tiny_model_dir: Path,
) -> None:
    """A request of clips each within every limit, whose planned tokens together pass
    --media-max-video-tokens, is refused as its videos load, before an encoding item exists."""
    from dataclasses import replace

    from epd.server.media.policy import MediaPolicy
    from epd.server.media.video_loader import VideoLoader
    from epd.server.media.video_planner import VideoPlanner
    from epd.server.route.media import load_videos
    from tests.unit.models.clips import make_clip

    planner = VideoPlanner(tiny_model_dir, "tiny")
    prompt_tokens = PromptBuilder(tiny_model_dir).video_tokens
    clip, other = make_clip(num_frames=8, fps=1), make_clip(num_frames=9, fps=1)
    tokens = planner.load(clip, MediaPolicy()).plan.num_tokens
    loader = VideoLoader(planner, replace(MediaPolicy(), max_video_tokens=tokens))
    (video,) = await load_videos(
        loader, [ImageSource(data=clip)], patches_per_chunk=2, video_tokens=prompt_tokens
    )
    assert video.video.plan.num_tokens == tokens and len(video.items) == 2
    for sources in ([clip, other], [clip] * 2):
        with pytest.raises(InvalidArgument) as caught:
            await load_videos(
                loader, [ImageSource(data=s) for s in sources], 2, video_tokens=prompt_tokens
            )
        assert caught.value.reason == "TOO_MANY_VIDEO_TOKENS"
    with pytest.raises(InvalidArgument) as caught:
        await load_videos(loader, [ImageSource(data=clip)] * 5, 2, video_tokens=prompt_tokens)
    assert caught.value.reason == "TOO_MANY_VIDEOS"


@pytest.mark.parametrize("family", ["llava", "internvl"])
async def test_a_family_without_video_refuses_it_at_the_route_by_name(
    family: str, tiny_family_dir: Callable[[str], Path]
) -> None:
    from epd.server.media.policy import MediaPolicy
    from epd.server.media.video_loader import VideoLoader
    from epd.server.media.video_planner import VideoPlanner
    from epd.server.models.registry import family_named
    from epd.server.route.media import load_videos
    from tests.unit.models.clips import make_clip

    model_dir = tiny_family_dir(family)
    loader = VideoLoader(VideoPlanner(model_dir, "tiny"), MediaPolicy())
    clip = ImageSource(data=make_clip(num_frames=8, fps=1))
    with pytest.raises(InvalidArgument) as caught:
        await load_videos(loader, [clip], 2, video_tokens=PromptBuilder(model_dir).video_tokens)
    assert caught.value.reason == "VIDEO_NOT_SUPPORTED"
    assert caught.value.message == f"{family_named(family).title} models do not take video"
