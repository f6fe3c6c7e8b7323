"""The tiny Qwen checkpoints carry their video settings as the hub's do: a video processor
(also in ``video_preprocessor_config.json``) that samples 2 frames a second, and a chat template
that places one placeholder group per video."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

PROCESSORS = {
    "qwen2_vl": "Qwen2VLVideoProcessor",
    "qwen2_5_vl": "Qwen2VLVideoProcessor",
    "qwen3_vl": "Qwen3VLVideoProcessor",
}


@pytest.mark.parametrize("family", sorted(PROCESSORS))
def test_a_tiny_qwen_checkpoint_loads_its_video_processor(
    family: str, tiny_family_dir: Callable[[str], Path]
) -> None:
    from transformers import AutoVideoProcessor

    model_dir = tiny_family_dir(family)
    saved = json.loads((model_dir / "video_preprocessor_config.json").read_text())
    nested = json.loads((model_dir / "processor_config.json").read_text())["video_processor"]

    processor = AutoVideoProcessor.from_pretrained(model_dir)

    assert saved == nested
    assert type(processor).__name__ == PROCESSORS[family]
    assert (processor.do_sample_frames, processor.fps) == (True, 2.0)
    assert (processor.min_frames, processor.max_frames) == (4, 768)


@pytest.mark.parametrize("family", sorted(PROCESSORS))
def test_the_chat_template_places_a_video_where_it_is(
    family: str, tiny_family_dir: Callable[[str], Path]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_family_dir(family))
    content = [
        {"type": "image"},
        {"type": "video"},
        {"type": "text", "text": "compare"},
        {"type": "video"},
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_vision_id=True
    )
    group = "<|vision_start|><|video_pad|><|vision_end|>"
    assert f"Picture 1: <|vision_start|><|image_pad|><|vision_end|>Video 1: {group}compare" in text
    assert text.count(group) == 2 and f"Video 2: {group}" in text
