"""The KV handle's images: the prefill engine lists the prompt's images and videos in its
``kv_transfer_params``, and the decode engine reads them back from the handle alone (grids,
names, videos' timing), takes them off before vLLM's connector sees the params, and refuses a
malformed list with INVALID_ARGUMENT ``BAD_KV_HANDLE`` (on a fake AsyncLLM: no engine is
started)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage, Sampling
from epd.server.engine.prompt_check import VisionLayout
from epd.server.engine.vllm_embeds import (
    IMAGE_GRIDS_KEY,
    IMAGE_HASHES_KEY,
    VIDEO_SECONDS_KEY,
    VIDEO_TIMESTAMPS_KEY,
    take_handle_images,
)
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_options import VllmOptions
from epd.server.models.registry import family_named
from tests.unit.engine.test_vllm_admission import FakeLlm, output

pytest.importorskip("vllm")

LAYOUT = VisionLayout(
    vision_start_id=1,
    image_pad_id=2,
    merge_size=2,
    embedding_width=8,
    family=family_named("qwen2_vl"),
    video_pad_id=3,
)
PROMPT = [9, 1, 2, 9, 1, 3, 9]
IMAGE = EngineImage("img", (1, 2, 2), embeddings=torch.ones(1, 8))
VIDEO = EngineImage("vid", (2, 2, 2), embeddings=torch.ones(2, 8), seconds_per_temporal_patch=0.5)


class HandOverLlm(FakeLlm):
    """Answers at once, as vLLM's NixlConnector does: a producer's final output carries the
    handle of its blocks; records the KV params each request gave vLLM."""

    def __init__(self) -> None:
        super().__init__()
        self.kv_params: list[dict[str, Any]] = []

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, priority: int = 0
    ) -> AsyncIterator[SimpleNamespace]:
        self.prompts.append(prompt)
        self.kv_params.append((params.extra_args or {}).get("kv_transfer_params"))
        answer = output(7, finished=True)
        answer.kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [0]}
        yield answer


async def test_the_decode_engine_gets_the_prefills_images_and_videos_from_the_handle() -> None:
    producer, consumer = HandOverLlm(), HandOverLlm()
    sampling = Sampling(max_tokens=4)
    prefill = VllmEngine(producer, "tiny", LAYOUT, VllmOptions(kv_role="kv_producer"))
    handle = (await prefill.prefill("r", PROMPT, [IMAGE, VIDEO], sampling)).kv_transfer_params
    assert handle is not None
    assert handle[IMAGE_GRIDS_KEY] == [[1, 2, 2], [2, 2, 2]]
    assert handle[IMAGE_HASHES_KEY] == ["img", "vid"]
    assert handle[VIDEO_SECONDS_KEY] == [None, 0.5] and handle[VIDEO_TIMESTAMPS_KEY] == [None, []]
    decode = VllmEngine(consumer, "tiny", LAYOUT, VllmOptions(kv_role="kv_consumer"))
    [chunk async for chunk in decode.decode("r", PROMPT, sampling, 7, handle)]
    assert consumer.rendered[-1]["multi_modal_uuids"] == {"image": ["img"], "video": ["vid"]}
    assert consumer.kv_params == [{"do_remote_prefill": True, "remote_block_ids": [0]}], (
        "the handle's image lists never reach vLLM's connector"
    )


async def test_an_image_prompts_handle_has_no_video_lists() -> None:
    prefill = VllmEngine(HandOverLlm(), "tiny", LAYOUT, VllmOptions(kv_role="kv_producer"))
    result = await prefill.prefill("r", [9, 1, 2, 9], [IMAGE], Sampling(max_tokens=4))
    assert result.kv_transfer_params is not None
    assert VIDEO_SECONDS_KEY not in result.kv_transfer_params
    assert take_handle_images(dict(result.kv_transfer_params)) == [EngineImage("img", (1, 2, 2))]


def test_images_come_back_from_the_handle_and_are_taken_off_it() -> None:
    images = [
        EngineImage("img", (1, 4, 4)),
        EngineImage("vid", (3, 4, 4), seconds_per_temporal_patch=1.0),
        EngineImage("qwen3", (2, 4, 4), seconds_per_temporal_patch=0.0, timestamps=(0.25, 1.3)),
    ]
    params = {
        "remote_port": 5601,
        IMAGE_GRIDS_KEY: [list(i.grid or ()) for i in images],
        IMAGE_HASHES_KEY: [i.mm_hash for i in images],
        VIDEO_SECONDS_KEY: [None, 1.0, 0.0],
        VIDEO_TIMESTAMPS_KEY: [None, [], [0.25, 1.3]],
    }
    assert take_handle_images(params) == images
    assert params == {"remote_port": 5601}
    # a handle without the video lists (images only) reads as images; without names, unnamed
    assert take_handle_images({IMAGE_GRIDS_KEY: [[1, 4, 6]]}) == [EngineImage("", (1, 4, 6))]
    assert take_handle_images({}) == []


@pytest.mark.parametrize(
    ("key", "values"),
    [
        *[
            (IMAGE_GRIDS_KEY, grids)
            for grids in (
                [[1, 4]],
                [[1, 4, "6"]],
                [[1.0, 4.0, 6.0]],
                [[1, 0, 6]],
                [[True, 4, 6]],
                5,
            )
        ],
        *[(IMAGE_HASHES_KEY, names) for names in (["a"], [], ["a", 1], "a")],
        *[(VIDEO_SECONDS_KEY, seconds) for seconds in ([1.0], "1.0", [None, "x"], [None, True])],
        *[
            (VIDEO_TIMESTAMPS_KEY, stamps)
            for stamps in ([[0.5]], [None, ["0.5"]], [None, 0.5], "x")
        ],
    ],
)
def test_a_malformed_list_is_a_bad_handle(key: str, values: object) -> None:
    params: dict[str, Any] = {IMAGE_GRIDS_KEY: [[1, 2, 2], [2, 2, 2]], key: values}
    with pytest.raises(InvalidArgument) as caught:
        take_handle_images(params)
    assert caught.value.reason == "BAD_KV_HANDLE"


async def test_a_malformed_handle_is_refused_before_the_engine_runs() -> None:
    llm = HandOverLlm()
    engine = VllmEngine(llm, "tiny", LAYOUT, VllmOptions(kv_role="kv_consumer"))
    handle = {"do_remote_prefill": True, IMAGE_GRIDS_KEY: [[1, "2", 2]]}
    with pytest.raises(InvalidArgument) as caught:
        [chunk async for chunk in engine.decode("r", PROMPT, Sampling(), 7, handle)]
    assert caught.value.reason == "BAD_KV_HANDLE" and llm.prompts == []


def test_the_prompt_check_counts_videos_apart_from_images() -> None:
    image = EngineImage("img", (1, 2, 2))
    video = EngineImage("vid", (2, 2, 2), seconds_per_temporal_patch=0.0)
    LAYOUT.check(PROMPT, [image, video], 100, grids_suffice=True)
    for images, reason in (
        ([image], "VIDEO_COUNT_MISMATCH"),
        ([image, image], "IMAGE_COUNT_MISMATCH"),
        ([video, image], "BAD_VIDEO_ORDER"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            LAYOUT.check(PROMPT, images, 100, grids_suffice=True)
        assert caught.value.reason == reason


def test_the_expansion_repeats_each_video_token_to_its_rows_in_prompt_order() -> None:
    video = EngineImage("vid", (2, 2, 4), seconds_per_temporal_patch=0.0)
    image = EngineImage("img", (1, 2, 2))
    expanded, ranges = LAYOUT.expand_with_ranges([9, 1, 3, 9, 1, 2, 9], [image, video])
    assert expanded == [9, 1, 3, 3, 3, 3, 9, 1, 2, 9]
    assert ranges == [(2, 4), (8, 1)]
