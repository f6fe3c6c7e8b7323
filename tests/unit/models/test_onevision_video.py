"""LLaVA-OneVision plans a video as transformers' processor and model take it: every frame kept
and resized to the tower's square, the processor's pixel values, each frame's pooled rows, one
newline row per video; a clip cut into runs of frames, prepared apart and batched with an image,
gives the model's own video features; vLLM's model takes no video embeddings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from epd.server.encode.vision import VisionEncoder
from epd.server.engine.base import EngineImage
from epd.server.engine.prompt_check import VisionLayout
from epd.server.models import onevision_video
from epd.server.models.registry import family_named
from epd.server.models.video import VideoClip, VideoRefused

FAMILY = "llava_onevision"


def processor_and_config(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoVideoProcessor

    return AutoVideoProcessor.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)


def frames(num_frames: int, height: int = 48, width: int = 64) -> np.ndarray:
    rng = np.random.default_rng(num_frames)
    return rng.integers(0, 255, (num_frames, height, width, 3), dtype=np.uint8)


def test_the_plan_and_pixels_are_the_processors(tiny_family_dir: Callable[[str], Path]) -> None:
    from transformers import AutoProcessor

    model_dir = tiny_family_dir(FAMILY)
    processor, config = processor_and_config(model_dir)
    kin = family_named(FAMILY)
    plan = kin.plan_video(VideoClip(7, 1.0, 64, 48), config, processor)
    video = frames(7)
    pixels, grid = kin.video_pixel_inputs(processor, video, plan.resized, config=config)

    expected = processor(videos=[video], return_tensors="pt")["pixel_values_videos"][0]
    counted = AutoProcessor.from_pretrained(model_dir)._get_num_multimodal_tokens(
        video_sizes=[(7, 48, 64)]
    )["num_video_tokens"]
    assert plan.frame_indices == tuple(range(7)) and plan.temporal_patch_size == 1
    assert torch.equal(pixels[onevision_video.VIDEO_PIXELS_KEY], expected)
    assert plan.grid == (7, 2, 2) and grid.tolist() == [[7, 2, 2]]
    assert plan.num_tokens == counted[0] == 7 * 4 + 1


@pytest.mark.parametrize(("attention", "patch_embedding"), [("auto", "auto"), ("packed", "matmul")])
@pytest.mark.parametrize("frames_per_chunk", [1, 3])
def test_chunks_batched_with_an_image_give_the_models_video_features(
    frames_per_chunk: int,
    attention: str,
    patch_embedding: str,
    tiny_family_dir: Callable[[str], Path],
) -> None:
    """The encoder's tower (transformers' execution, and the accelerator's default forced on
    CPU) on runs of frames, each prepared apart and joined in one batch after an image; the
    joined rows and the engine's newline row equal transformers' ``get_video_features``, the
    image's rows its ``get_image_features``."""
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_family_dir(FAMILY)
    encoder = VisionEncoder(model_dir, attention=attention, patch_embedding=patch_embedding)
    video, picture = frames(7), frames(1, 90, 60)[0]
    chunks = [
        encoder.prepare_video(torch.from_numpy(video[start : start + frames_per_chunk]), (56, 56))
        for start in range(0, 7, frames_per_chunk)
    ]
    results = encoder.run([encoder.prepare(torch.from_numpy(picture)), *chunks])
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor, _ = processor_and_config(model_dir)
    pixels = processor(videos=[video], return_tensors="pt")["pixel_values_videos"]
    image_pixels, _ = encoder.preprocess([Image.fromarray(picture)])
    with torch.inference_mode():
        expected = model.model.get_video_features(pixel_values_videos=pixels).pooler_output[0]
        image = torch.cat(list(model.model.get_image_features(**image_pixels).pooler_output))
        joined = torch.cat([rows for rows, _ in results[1:]])
        ours = family_named(FAMILY).video_language_rows(model, joined)
    assert [grid for _, grid in results[1:]] == [
        (len(range(start, min(start + frames_per_chunk, 7))), 2, 2)
        for start in range(0, 7, frames_per_chunk)
    ]
    assert torch.allclose(results[0][0], image, atol=1e-5, rtol=1e-5)
    assert ours.shape == expected.shape == (7 * 4 + 1, expected.shape[1])
    assert torch.allclose(ours, expected, atol=1e-5, rtol=1e-5)


def test_a_video_placeholder_is_the_video_token_alone(
    tiny_family_dir: Callable[[str], Path],
) -> None:
    """LLaVA-OneVision has no vision start token: a video's placeholder is its video token,
    which the transformers engine expands to its rows and its newline row."""
    from transformers import AutoConfig, AutoTokenizer

    model_dir = tiny_family_dir(FAMILY)
    config = AutoConfig.from_pretrained(model_dir)
    layout = VisionLayout.of(config, AutoTokenizer.from_pretrained(model_dir))
    rows = torch.zeros(12, layout.embedding_width)
    video = EngineImage("v", (3, 2, 2), embeddings=rows, seconds_per_temporal_patch=0.0)
    prompt = [1, config.video_token_id, 2]
    tokens = family_named(FAMILY).video_prompt_tokens((3, 2, 2), (), config, None)

    layout.check(prompt, [video], 100)
    assert layout.video_tokens(0, video) == tokens
    expanded, ranges = layout.expand_with_ranges(prompt, [video])
    assert layout.count_placeholders(prompt) == (0, 1)
    assert expanded == [1, *[config.video_token_id] * 13, 2] and ranges == [(1, 13)]


def test_vllm_is_refused_a_video_by_name() -> None:
    with pytest.raises(VideoRefused, match="embeddings on the transformers engine only") as refused:
        family_named(FAMILY).vllm_video_data([torch.zeros(5, 8)], [(1, 2, 2)], [0.0], [()])
    assert refused.value.reason == "VIDEO_NOT_SUPPORTED"
