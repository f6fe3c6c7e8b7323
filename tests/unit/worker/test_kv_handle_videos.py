"""The KV handle's video entries: which of the prefill's grids are videos, for decode."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.server.engine.base import IMAGE_GRIDS_KEY, IMAGE_HASHES_KEY, EngineImage
from epd.server.engine.prompt_check import VisionLayout
from epd.server.worker.convert import (
    VIDEO_SECONDS_KEY,
    VIDEO_TIMESTAMPS_KEY,
    decode_kv_params,
    handle_images,
    kv_handle_to_proto,
    video_params,
)

LAYOUT = VisionLayout(
    vision_start_id=1, image_pad_id=2, merge_size=2, embedding_width=8, video_pad_id=3
)


def test_decode_gets_the_prefills_images_and_videos_back() -> None:
    images = [
        EngineImage("img", (1, 4, 4)),
        EngineImage("vid", (3, 4, 4), seconds_per_temporal_patch=1.0),
        EngineImage("qwen3", (2, 4, 4), seconds_per_temporal_patch=0.0, timestamps=(0.25, 1.3)),
    ]
    params = {
        IMAGE_GRIDS_KEY: [list(i.grid or ()) for i in images],
        IMAGE_HASHES_KEY: [i.mm_hash for i in images],
        **video_params(images),
    }
    assert handle_images(decode_kv_params(kv_handle_to_proto(params).payload)) == images
    # a handle without the keys (images only) reads as images
    del params[VIDEO_SECONDS_KEY], params[VIDEO_TIMESTAMPS_KEY]
    assert [i.is_video for i in handle_images(params)] == [False, False, False]


@pytest.mark.parametrize("seconds", [[1.0], "1.0", [None, "x"], [None, True]])
def test_a_bad_video_list_is_refused(seconds: object) -> None:
    params = {IMAGE_GRIDS_KEY: [[1, 2, 2], [2, 2, 2]], VIDEO_SECONDS_KEY: seconds}
    with pytest.raises(InvalidArgument) as caught:
        handle_images(params)
    assert caught.value.reason == "BAD_KV_HANDLE"


@pytest.mark.parametrize("stamps", [[[0.5]], [None, ["0.5"]], [None, 0.5], "x"])
def test_a_bad_timestamps_list_is_refused(stamps: object) -> None:
    params = {IMAGE_GRIDS_KEY: [[1, 2, 2], [2, 2, 2]], VIDEO_TIMESTAMPS_KEY: stamps}
    with pytest.raises(InvalidArgument) as caught:
        handle_images(params)
    assert caught.value.reason == "BAD_KV_HANDLE"


def test_the_prompt_check_counts_videos_apart_from_images() -> None:
    prompt = [9, 1, 2, 9, 1, 3, 9]
    image = EngineImage("img", (1, 2, 2))
    video = EngineImage("vid", (2, 2, 2), seconds_per_temporal_patch=0.0)
    LAYOUT.check(prompt, [image, video], 100, grids_suffice=True)
    for images, reason in (
        ([image], "VIDEO_COUNT_MISMATCH"),
        ([image, image], "IMAGE_COUNT_MISMATCH"),
        ([video, image], "BAD_VIDEO_ORDER"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            LAYOUT.check(prompt, images, 100, grids_suffice=True)
        assert caught.value.reason == reason


def test_the_expansion_repeats_each_video_token_to_its_rows_in_prompt_order() -> None:
    video = EngineImage("vid", (2, 2, 4), seconds_per_temporal_patch=0.0)
    image = EngineImage("img", (1, 2, 2))
    expanded, ranges = LAYOUT.expand_with_ranges([9, 1, 3, 9, 1, 2, 9], [image, video])
    assert expanded == [9, 1, 3, 3, 3, 3, 9, 1, 2, 9]
    assert ranges == [(2, 4), (8, 1)]
