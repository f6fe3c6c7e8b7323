"""A video's prompt tokens as the engine holds them, counted once for every use: the route's
expanded prompt and block hashes, and the engines' PROMPT_TOO_LONG pre-check, take what the
family writes for a video (Qwen3-VL: each temporal patch's ``<t seconds>`` text, then its rows
between vision start and end), as transformers' processor expands the same chat and clip."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from epd.common.errors import Code, InvalidArgument
from epd.server.engine.base import EngineImage, VideoFrames
from epd.server.engine.prompt_check import VisionLayout
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import PlannedVideo, VideoPlanner
from epd.server.route import engine_prompt
from epd.server.route.media import load_videos
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, ImageSource
from tests.unit.models.clips import make_clip

QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# 8 frames at 1 fps: 4 temporal patches, each shown at its own second on Qwen3-VL
CLIP = make_clip(num_frames=8, width=64, height=48, fps=1)
CHAT = [ChatMessage("user", [ChatPart(video=ImageSource(data=b"-")), ChatPart(text="what?")])]
MM_HASH = "ab12cd34"


def processor_ids(model_dir: Path, video: PlannedVideo) -> list[int]:
    """transformers' processor's input ids for ``CHAT`` with the planned clip's kept frames and
    their timing (the reference expansion; vLLM 0.32 expands the video token the same way)."""
    from transformers import AutoProcessor
    from transformers.video_utils import VideoMetadata

    processor = AutoProcessor.from_pretrained(model_dir)
    chat = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    stream = video.stream
    metadata = VideoMetadata(
        total_num_frames=stream.num_frames,
        fps=stream.fps,
        frames_indices=list(video.plan.frame_indices),
    )
    inputs = processor(
        text=[text],
        videos=[video.frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        return_tensors="pt",
    )
    return [int(token) for token in inputs["input_ids"][0]]


@pytest.fixture(params=QWEN)
def planned(request: Any, tiny_family_dir: Callable[[str], Path]) -> tuple[Path, PlannedVideo]:
    model_dir = tiny_family_dir(request.param)
    return model_dir, VideoPlanner(model_dir, "tiny").load(CLIP, MediaPolicy())


def test_the_expanded_prompt_and_its_block_hashes_are_the_processors(
    planned: tuple[Path, PlannedVideo],
) -> None:
    model_dir, video = planned
    builder = PromptBuilder(model_dir)
    token_ids = builder.token_ids(CHAT)
    reference = processor_ids(model_dir, video)
    tokens = builder.video_tokens(video.plan)

    assert builder.expanded_ids(token_ids, [], [tokens]) == reference
    # NOTE: the block hashes are those of the reference with each video row its hash's pad.
    pad = -(int(MM_HASH, 16) + 1)
    padded = [pad if token == builder.video_pad_id else token for token in reference]
    hashes = builder.block_hashes(token_ids, [], [(MM_HASH, tokens)])
    assert hashes == builder.block_hashes(padded, [], [])
    assert len(hashes) == len(reference) // 16


def test_a_video_s_tokens_are_counted_once_as_it_loads(
    planned: tuple[Path, PlannedVideo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route counts a video's prompt tokens as it loads it (``RouteVideo.tokens``); its
    block hashes, a truncation and the expanded ids take them from there, not from the family
    again (Qwen3-VL tokenises each patch's timestamp)."""
    model_dir, _ = planned
    builder = PromptBuilder(model_dir)
    loader = VideoLoader(VideoPlanner(model_dir, "tiny"), MediaPolicy())
    loaded = load_videos(loader, [ImageSource(data=CLIP)], 2, video_tokens=builder.video_tokens)
    (video,) = asyncio.run(loaded)
    token_ids = builder.token_ids(CHAT)
    assert video.tokens == builder.video_tokens(video.video.plan)
    expected = builder.expanded_ids(token_ids, [], [video.tokens])
    hashes = builder.block_hashes(token_ids, [], [(video.video.video_hash, video.tokens)])

    def counted_again(plan: object) -> None:
        raise AssertionError("the video's tokens were counted again")

    monkeypatch.setattr(builder, "video_tokens", counted_again)
    assert engine_prompt.block_hashes(builder, token_ids, [], [video]) == hashes
    assert engine_prompt.expanded(builder, token_ids, [], [video]) == expected
    request = ChatRequest("r", "tiny", CHAT, truncate_prompt_tokens=len(expected))
    assert engine_prompt.truncated(builder, request, token_ids, [], [video]) == token_ids


def test_the_engines_pre_check_counts_the_videos_prompt_tokens(
    planned: tuple[Path, PlannedVideo],
) -> None:
    """A prompt a few tokens over the context is a clean 400 (INVALID_ARGUMENT,
    PROMPT_TOO_LONG) before vLLM sees it, Qwen3-VL's timestamps counted; one that fits
    passes."""
    from transformers import AutoConfig, AutoTokenizer

    model_dir, video = planned
    layout = VisionLayout.of(
        AutoConfig.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    )
    token_ids = PromptBuilder(model_dir).token_ids(CHAT)
    reference = processor_ids(model_dir, video)
    plan = video.plan
    engine_video = EngineImage(
        MM_HASH,
        plan.grid,
        embeddings=torch.zeros(plan.num_tokens, layout.embedding_width),
        seconds_per_temporal_patch=plan.seconds_per_temporal_patch or 0.0,
        timestamps=plan.timestamps or (),
    )

    layout.check(token_ids, [engine_video], max_len=len(reference) + 1)
    with pytest.raises(InvalidArgument) as caught:
        layout.check(token_ids, [engine_video], max_len=len(reference) - 2)
    assert caught.value.reason == "PROMPT_TOO_LONG"
    assert caught.value.code == Code.INVALID_ARGUMENT
    assert f"expands to {len(reference)} tokens" in str(caught.value)
    assert layout.expand(token_ids, [engine_video]) == reference
    # NOTE: a decode worker's video comes with its grid and timestamps only, an encode_prefill
    # worker's with its raw kept frames (its engine runs the tower): each counts the same
    grid_only = EngineImage(
        MM_HASH, plan.grid, seconds_per_temporal_patch=0.0, timestamps=plan.timestamps or ()
    )
    with pytest.raises(InvalidArgument, match=f"expands to {len(reference)} tokens"):
        layout.check(token_ids, [grid_only], len(reference) - 2, grids_suffice=True)
    stream = video.stream
    frames = VideoFrames(video.frames, stream.fps, stream.num_frames, plan.frame_indices)
    raw = replace(grid_only, frames=frames)
    layout.check(token_ids, [raw], max_len=len(reference) + 1)
    with pytest.raises(InvalidArgument, match=f"expands to {len(reference)} tokens"):
        layout.check(token_ids, [raw], len(reference) - 2)
