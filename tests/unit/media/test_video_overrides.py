"""vLLM 0.32's ``mm_processor_kwargs`` and ``media_io_kwargs`` on a video: the keys that set the
sampling and the pixel budget reach the plan exactly as transformers' video processor takes
them; the rest are ignored as vLLM ignores them or refused by name; untrusted ones are refused
with vLLM's message; the override is part of the video's identity and cache key; the policy's
limits still bound the plan."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import MediaKwargs, VideoOverrides
from epd.server.media.video_planner import VideoPlanner
from tests.unit.models.clips import make_clip
from tests.unit.models.test_qwen_video import decoded, video_processor

QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TRUSTED = MediaPolicy(trust_request_mm_kwargs=True)
CLIP = make_clip(num_frames=24, width=64, height=48, fps=8)


@pytest.fixture(scope="module")
def loader(tiny_model_dir: Path) -> VideoLoader:
    return VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), TRUSTED)


def overrides_of(
    loader: VideoLoader,
    processor: dict[str, Any] | None = None,
    io: dict[str, Any] | None = None,
    has_images: bool = False,
) -> VideoOverrides:
    return loader.overrides(MediaKwargs(processor, io), has_images=has_images)


@pytest.mark.parametrize(
    ("processor", "io", "expected"),
    [
        ({"fps": 1}, None, VideoOverrides(fps=1.0)),
        ({"num_frames": 6, "min_frames": 2}, None, VideoOverrides(num_frames=6, min_frames=2)),
        ({"videos_kwargs": {"fps": 4}, "fps": 1}, None, VideoOverrides(fps=4.0)),
        ({"images_kwargs": {"max_pixels": 99}}, None, VideoOverrides()),
        (
            {"size": {"shortest_edge": 1000, "longest_edge": 9000}},
            None,
            VideoOverrides(min_pixels=1000, max_pixels=9000),
        ),
        (
            {"size": {"longest_edge": 9000}, "max_pixels": 8000},
            None,
            VideoOverrides(max_pixels=8000),
        ),
        (None, {"video": {"num_frames": 16}}, VideoOverrides(num_frames=16)),
        (None, {"video": {"fps": 1, "max_frames": 8}}, VideoOverrides(fps=1.0, max_frames=8)),
        (
            {"num_frames": 4},
            {"video": {"fps": 1, "min_frames": 2}},
            VideoOverrides(num_frames=4, min_frames=2),
        ),
        ({"do_normalize": True, "device": "cpu", "no_such_setting": 3}, None, VideoOverrides()),
        (None, {"video": {"hw_decoders": 2, "pool_size": 1}, "audio": {"x": 1}}, VideoOverrides()),
        (
            {"cap_pixels_per_frame": True, "max_pixels": 9000},
            None,
            VideoOverrides(cap_pixels_per_frame=True, max_pixels=9000),
        ),
    ],
)
def test_each_key_reaches_the_setting_vllm_gives_it(
    loader: VideoLoader, processor: Any, io: Any, expected: VideoOverrides
) -> None:
    assert overrides_of(loader, processor, io) == expected


PROC, IO = "mm_processor_kwargs", "media_io_kwargs.video"
BAD, NOT = "BAD_MEDIA_KWARGS", "MEDIA_KWARGS_NOT_SUPPORTED"


@pytest.mark.parametrize(
    ("processor", "io", "param", "reason"),
    [
        ({"fps": 0}, None, f"{PROC}.fps", BAD),
        ({"fps": "fast"}, None, f"{PROC}.fps", BAD),
        ({"num_frames": 2.5}, None, f"{PROC}.num_frames", BAD),
        ({"fps": 1, "num_frames": 4}, None, PROC, BAD),
        ({"min_frames": 9, "max_frames": 3}, None, f"{PROC}.min_frames", BAD),
        ({"min_pixels": 9000, "max_pixels": 300}, None, f"{PROC}.min_pixels", BAD),
        ({"cap_pixels_per_frame": 1}, None, f"{PROC}.cap_pixels_per_frame", BAD),
        (None, {"video": {"fps": -1}}, f"{IO}.fps", BAD),
        ({"do_resize": False}, None, f"{PROC}.do_resize", NOT),
        ({"videos_kwargs": {"temporal_patch_size": 4}}, None, f"{PROC}.temporal_patch_size", NOT),
        ({"do_sample_frames": False}, None, f"{PROC}.do_sample_frames", NOT),
        ({"max_video_tokens": 64}, None, f"{PROC}.max_video_tokens", NOT),
        ({"size": {"height": 64}}, None, f"{PROC}.size.height", NOT),
        (None, {"video": {"backend": "torchcodec"}}, f"{IO}.backend", NOT),
        (None, {"video": {"max_duration": 10}}, f"{IO}.max_duration", NOT),
        (None, {"image": {"image_mode": "RGBA"}}, "media_io_kwargs.image", NOT),
        ({"videos_kwargs": 3}, None, f"{PROC}.videos_kwargs", BAD),
    ],
)
def test_a_key_epd_cannot_honour_or_a_bad_value_is_a_400_naming_it(
    loader: VideoLoader, processor: Any, io: Any, param: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        overrides_of(loader, processor, io)
    assert (caught.value.metadata["param"], caught.value.reason) == (param, reason)


def test_an_image_setting_but_its_pixel_budget_is_refused_only_with_an_image(
    loader: VideoLoader,
) -> None:
    """An image's pixel budget is honoured (``image_settings``); its other settings are not."""
    for processor in (
        {"images_kwargs": {"image_mean": [0.5] * 3}},
        {"images_kwargs": {"resample": 2}},
    ):
        with pytest.raises(InvalidArgument, match="image") as caught:
            overrides_of(loader, processor, has_images=True)
        assert caught.value.reason == "MEDIA_KWARGS_NOT_SUPPORTED"
        assert overrides_of(loader, processor, has_images=False) == VideoOverrides()
    assert overrides_of(loader, {"max_pixels": 9000}, has_images=True) == (
        VideoOverrides(max_pixels=9000)
    )
    images_only = {"images_kwargs": {"size": {"longest_edge": 9000}}}
    assert overrides_of(loader, images_only, has_images=True) == VideoOverrides()
    assert overrides_of(loader, {"fps": 1, "do_rescale": True}, has_images=True).fps == 1.0


def test_untrusted_kwargs_are_refused_with_vllms_message(tiny_model_dir: Path) -> None:
    from vllm.entrypoints.generate.base.protocol import validate_request_mm_kwargs
    from vllm.exceptions import VLLMValidationError

    untrusted = VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), MediaPolicy())
    for field, value in (("mm_processor_kwargs", {"fps": 1}), ("media_io_kwargs", {"video": {}})):
        given = {"mm_processor_kwargs": None, "media_io_kwargs": None, field: value}
        with pytest.raises(VLLMValidationError) as expected:
            validate_request_mm_kwargs(**given, trust_request_mm_kwargs=False)
        with pytest.raises(InvalidArgument) as caught:
            untrusted.overrides(MediaKwargs(**given), has_images=False)
        assert str(caught.value) == expected.value.args[0]
        assert caught.value.metadata["param"] == field
    assert untrusted.overrides(MediaKwargs({}, {}), has_images=False) == VideoOverrides()


def test_the_servers_kwargs_are_the_default_and_a_requests_merge_over_them(
    tiny_model_dir: Path,
) -> None:
    policy = MediaPolicy(
        mm_processor_kwargs={"videos_kwargs": {"max_pixels": 9000}, "min_frames": 2},
        media_io_kwargs={"video": {"num_frames": 8}},
        trust_request_mm_kwargs=True,
    )
    loader = VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), policy)
    assert loader.defaults == VideoOverrides(num_frames=8, min_frames=2, max_pixels=9000)
    # NOTE: as vLLM's VideoMediaIO.merge_kwargs, a request's fps drops the server's num_frames
    got = overrides_of(loader, None, {"video": {"fps": 1}})
    assert got == VideoOverrides(fps=1.0, min_frames=2, max_pixels=9000)
    # NOTE: vLLM's merge: server flat < server scoped < request flat < request scoped
    assert overrides_of(loader, {"max_pixels": 5000}) == VideoOverrides(
        num_frames=8, min_frames=2, max_pixels=5000
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"images_kwargs": {"resample": 2}},
        {"images_kwargs": {"min_pixels": 40_000_000}},
        {"do_resize": False},
        {"fps": -2},
        {"videos_kwargs": 1},
    ],
)
def test_a_bad_server_flag_fails_at_startup(tiny_model_dir: Path, kwargs: Any) -> None:
    with pytest.raises(ValueError, match="--mm-processor-kwargs"):
        VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), MediaPolicy(mm_processor_kwargs=kwargs))


@pytest.mark.parametrize("family", QWEN)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"fps": 1},
        {"fps": 4, "max_frames": 6},
        {"num_frames": 6},
        {"min_frames": 8, "fps": 0.5},
        {"num_frames": 10, "max_frames": 8},
    ],
    ids=str,
)
def test_the_overridden_sampling_is_transformers_with_the_same_kwargs(
    family: str, kwargs: dict[str, Any], tiny_family_dir: Callable[[str], Path]
) -> None:
    model_dir = tiny_family_dir(family)
    processor = video_processor(model_dir)
    frames, clip = decoded(37, 12, 160, 120)
    loader = VideoLoader(VideoPlanner(model_dir, "tiny"), TRUSTED)
    overrides = overrides_of(loader, kwargs)
    plan = loader.planner.plan(_stream(clip), overrides)

    # NOTE: transformers refuses num_frames beside the processor's fps; epd's num_frames
    # clears it, as vLLM's media_io merge drops the other of the two
    expected = reference(processor, frames, clip, {"fps": None, **kwargs})

    assert list(plan.frame_indices) == [
        int(i) for i in expected["video_metadata"][0].frames_indices
    ]
    assert [list(plan.grid)] == expected["video_grid_thw"].tolist()
    assert plan != loader.planner.plan(_stream(clip)), "the override changes the plan"


def test_an_override_is_part_of_the_videos_identity_and_cache_key(loader: VideoLoader) -> None:
    import asyncio

    async def load(overrides: VideoOverrides | None) -> Any:
        return await loader.load(data=CLIP, overrides=overrides)

    async def run() -> list[Any]:
        return [
            await load(o) for o in (None, VideoOverrides(fps=1.0), None, VideoOverrides(fps=1.0))
        ]

    before = loader.num_decoded
    default, slow, default_again, slow_again = asyncio.run(run())
    assert loader.num_decoded - before == 2, "each setting decoded once, then cached"
    assert default_again is default and slow_again is slow
    assert slow.video_hash != default.video_hash
    assert len(slow.frames) < len(default.frames)
    # NOTE: a chunk is named by its frames and size alone: the same kept frames share chunks
    half = VideoOverrides(num_frames=len(default.frames))
    same_frames = asyncio.run(load(half))
    assert same_frames.video_hash != default.video_hash
    assert [c.content_hash for c in loader.planner.chunks(same_frames, 1)] == [
        c.content_hash for c in loader.planner.chunks(default, 1)
    ]


def test_an_override_cannot_lift_a_limit(tiny_model_dir: Path) -> None:
    from epd.server.media.video import check_video_tokens

    policy = MediaPolicy(trust_request_mm_kwargs=True, max_video_frame_pixels=64 * 48 * 2)
    loader = VideoLoader(VideoPlanner(tiny_model_dir, "tiny"), policy)
    upscaled = overrides_of(loader, {"min_pixels": 200_000})
    with pytest.raises(InvalidArgument) as caught:
        loader.planner.load(CLIP, policy, upscaled)
    assert caught.value.reason == "VIDEO_FRAME_TOO_LARGE"
    many = loader.planner.load(CLIP, policy, overrides_of(loader, {"fps": 8}))
    with pytest.raises(InvalidArgument) as caught:
        check_video_tokens([many.plan.num_tokens], MediaPolicy(max_video_tokens=16))
    assert caught.value.reason == "TOO_MANY_VIDEO_TOKENS"


def reference(processor: Any, frames: Any, clip: Any, kwargs: dict[str, Any]) -> Any:
    """transformers' video processor sampling and resizing every decoded frame itself, with
    ``kwargs`` as vLLM hands a request's ``mm_processor_kwargs`` to it."""
    from transformers.video_utils import VideoMetadata

    metadata = VideoMetadata(total_num_frames=clip.num_frames, fps=clip.fps)
    return processor(
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=True,
        return_metadata=True,
        return_tensors="pt",
        **kwargs,
    )


def _stream(clip: Any) -> Any:
    from epd.server.media.video import VideoStream
    from epd.server.media.video_timing import VideoTiming

    timing = VideoTiming(tuple(i / clip.fps for i in range(clip.num_frames)), clip.fps)
    return VideoStream("mp4", "h264", clip.width, clip.height, timing)


@pytest.fixture(scope="module")
def vllm_processors(tiny_family_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    """vLLM's multimodal processor of a family's tiny checkpoint, built once (no engine)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    built: dict[str, Any] = {}

    def processor(family: str) -> Any:
        if family not in built:
            config = ModelConfig(model=str(tiny_family_dir(family)), max_model_len=4096)
            built[family] = MULTIMODAL_REGISTRY.create_processor(config)
        return built[family]

    return processor


@pytest.mark.parametrize("family", QWEN)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_pixels": 6272},
        {"min_pixels": 200_000},
        {"size": {"shortest_edge": 3136, "longest_edge": 6272}},
        {"videos_kwargs": {"max_pixels": 6272}, "max_pixels": 99},
        {"max_pixels": 6272, "cap_pixels_per_frame": True},
    ],
    ids=str,
)
def test_the_pixel_budget_is_vllms_on_the_same_frames(
    family: str,
    kwargs: dict[str, Any],
    tiny_family_dir: Callable[[str], Path],
    vllm_processors: Callable[[str], Any],
) -> None:
    """vLLM's processor given the kept frames (not sampling again) and the request's
    ``mm_processor_kwargs`` makes the grid and placeholder count epd planned."""
    from transformers import AutoTokenizer
    from vllm.multimodal.processing import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    model_dir = tiny_family_dir(family)
    frames, clip = decoded(37, 12, 160, 120)
    loader = VideoLoader(VideoPlanner(model_dir, "tiny"), TRUSTED)
    plan = loader.planner.plan(_stream(clip), overrides_of(loader, kwargs))
    processor = vllm_processors(family)
    metadata = {
        "fps": clip.fps,
        "total_num_frames": clip.num_frames,
        "duration": clip.num_frames / clip.fps,
        "frames_indices": list(plan.frame_indices),
        "do_sample_frames": False,
    }
    items = processor.info.parse_mm_data({"video": [(frames[list(plan.frame_indices)], metadata)]})
    prompt = AutoTokenizer.from_pretrained(model_dir).encode("<|video_pad|>")
    inputs = ProcessorInputs(
        prompt, items, hf_processor_mm_kwargs={**kwargs, "do_sample_frames": False}
    )
    output = processor.apply(inputs, TimingContext())

    assert output["mm_kwargs"]["video"][0]["video_grid_thw"].data.tolist() == list(plan.grid)
    assert output["prompt_token_ids"].count(prompt[0]) == plan.num_tokens
    assert plan.grid != loader.planner.plan(_stream(clip)).grid


def test_epd_up_hands_the_flags_to_the_route_which_reads_them_back() -> None:
    import argparse

    from epd.server.media.media_cli import (
        add_media_arguments,
        add_passed_on_media_arguments,
        media_policy,
        route_media_flags,
    )

    up = argparse.ArgumentParser()
    add_passed_on_media_arguments(up)
    assert route_media_flags(up.parse_args([])) == ()
    given = ['{"fps": 1, "videos_kwargs": {"max_pixels": 9000}}', '{"video": {"num_frames": 8}}']
    args = up.parse_args(
        ["--mm-processor-kwargs", given[0], "--media-io-kwargs", given[1]]
        + ["--trust-request-mm-kwargs"]
    )
    route = argparse.ArgumentParser()
    add_media_arguments(route)
    policy = media_policy(route.parse_args(list(route_media_flags(args))))
    assert policy.mm_processor_kwargs == {"fps": 1, "videos_kwargs": {"max_pixels": 9000}}
    assert policy.media_io_kwargs == {"video": {"num_frames": 8}}
    assert policy.trust_request_mm_kwargs
    with pytest.raises(SystemExit):
        route.parse_args(["--mm-processor-kwargs", "[1]"])
