"""The route's expansion of a Qwen3-VL video's placeholder is the prompt vLLM prefills: the
expanded ids (``return_token_ids``) equal the ``prompt_token_ids`` monolithic vLLM reports for
the same chat and kept frames (each temporal patch's ``<t seconds>`` text, then its rows between
vision start and end), and the block hashes the route routes by are those of that prompt, each
video row the video's pad, so they line up with vLLM's blocks. On the family's engines of
``test_video_in_process.py`` (one start for both modules)."""

from __future__ import annotations

import pytest

from epd.server.media.policy import MediaPolicy
from epd.server.media.video_planner import VideoPlanner
from epd.server.route.prompt import PromptBuilder
from tests.integration.e2e.test_video_in_process import CLIP, vllm_video_prompt

pytestmark = pytest.mark.vllm
FAMILY = "qwen3_vl"
MM_HASH = "ab12cd34"


async def test_the_routes_expanded_video_prompt_is_the_one_vllm_prefills(
    tiny_family_dir, family_engines
) -> None:
    from vllm import SamplingParams

    model_dir = tiny_family_dir(FAMILY)
    producer, _ = await family_engines(FAMILY)
    video = VideoPlanner(model_dir, "tiny").load(CLIP, MediaPolicy())
    builder = PromptBuilder(model_dir)
    prompt = vllm_video_prompt(model_dir, video)
    token_ids = prompt["prompt_token_ids"]
    final = None
    async for output in producer._llm.generate(prompt, SamplingParams(max_tokens=1), "ids"):
        final = output
    assert final is not None
    prefilled = list(final.prompt_token_ids)
    tokens = builder.video_tokens(video.plan)

    assert builder.expanded_ids(token_ids, [], [tokens]) == prefilled
    pad = -(int(MM_HASH, 16) + 1)
    padded = [pad if token == builder.video_pad_id else token for token in prefilled]
    hashes = builder.block_hashes(token_ids, [], [(MM_HASH, tokens)])
    assert hashes == builder.block_hashes(padded, [], [])
    assert len(hashes) == len(prefilled) // 16
