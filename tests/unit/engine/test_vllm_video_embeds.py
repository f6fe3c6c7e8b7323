"""vLLM prompts for videos given as embeddings: vLLM's public input, with Qwen2.5-VL's seconds
per temporal patch (its M-RoPE positions) and Qwen3-VL's timestamps (which vLLM writes into
the prompt as ``<t seconds>`` before each temporal patch)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from epd.server.engine.base import EngineImage
from epd.server.engine.prompt_check import VisionLayout
from epd.server.engine.vllm_embeds import embeddings_prompt
from epd.server.models.registry import family_named

VIDEO_PAD = 9
# an image, a video, then text: 5 opens each placeholder, 7 closes it
PROMPT = [1, 5, 6, 7, 5, VIDEO_PAD, 7, 3]
IMAGE = EngineImage("img", (1, 2, 4), embeddings=torch.ones(2, 8))
VIDEO = EngineImage(
    "vid",
    (3, 2, 2),
    embeddings=torch.arange(3.0).repeat_interleave(8).view(3, 8),
    seconds_per_temporal_patch=2.0,
    timestamps=(0.5, 2.5, 4.5),
)


def layout(family: str) -> VisionLayout:
    return VisionLayout(
        5, 6, merge_size=2, embedding_width=8, family=family_named(family), video_pad_id=9
    )


def test_qwen2_5_vls_seconds_per_temporal_patch_go_to_vllms_public_input() -> None:
    """vLLM's Qwen2.5-VL processor makes the items of the whole dict with its field config,
    second_per_grid_ts included, which its M-RoPE positions read (the end-to-end video test
    checks the tokens)."""
    video = replace(VIDEO, timestamps=())
    prompt = embeddings_prompt("r", PROMPT, [IMAGE, video], layout("qwen2_5_vl"))
    data = prompt["multi_modal_data"]["video"]
    assert data["second_per_grid_ts"].tolist() == [2.0] and "timestamps" not in data
    assert prompt["prompt_token_ids"] == PROMPT


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_timestamps_go_to_vllms_public_input(family: str) -> None:
    prompt = embeddings_prompt("r", PROMPT, [IMAGE, VIDEO], layout(family))
    assert prompt["prompt_token_ids"] == PROMPT
    video = prompt["multi_modal_data"]["video"]
    assert torch.equal(video["video_embeds"], VIDEO.embeddings)
    assert [stamps.tolist() for stamps in video["timestamps"]] == [[0.5, 2.5, 4.5]]
    untimed = replace(VIDEO, seconds_per_temporal_patch=0.0, timestamps=())
    plain = embeddings_prompt("r", PROMPT, [IMAGE, untimed], layout(family))
    assert set(plain["multi_modal_data"]["video"]) == {"video_embeds", "video_grid_thw"}


def test_a_videos_timestamps_must_match_its_temporal_patches() -> None:
    from epd.common.errors import InvalidArgument

    wrong = replace(VIDEO, timestamps=(0.5, 2.5))
    with pytest.raises(InvalidArgument) as caught:
        layout("qwen3_vl").check(PROMPT, [IMAGE, wrong], 100)
    assert caught.value.reason == "BAD_GRID"
