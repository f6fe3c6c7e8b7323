"""The vision tower loaded alone gives, for every family, exactly the image features the full
model (transformers) feeds its language model, at the width the engines check."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from epd.server.encode.vision import VisionEncoder
from epd.server.engine.prompt_check import VisionLayout
from epd.server.models.registry import FAMILIES


@pytest.mark.parametrize("family", [family.name for family in FAMILIES])
def test_the_tower_alone_equals_the_models_own_image_features(
    tiny_family_dir: Callable[[str], Path], family: str
) -> None:
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    model_dir = tiny_family_dir(family)
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)),
        Image.fromarray(rng.integers(0, 255, (90, 60, 3), dtype=np.uint8)),
    ]
    encoder = VisionEncoder(model_dir)
    ours = encoder.encode(images)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    pixels, grid = encoder.preprocess(images)
    # NOTE: LLaVA-OneVision's pixel inputs carry the image sizes its tiles are packed by.
    inputs = dict(pixels) if isinstance(pixels, Mapping) else {"pixel_values": pixels}
    with torch.inference_mode():
        features = model.model.get_image_features(**inputs, image_grid_thw=grid)
    # NOTE: DeepStack features (Qwen3-VL) ride beside the merger's output, on the last axis, as
    # vLLM takes them in image_embeds.
    levels = [features.pooler_output, *(getattr(features, "deepstack_features", None) or [])]
    expected = torch.cat([torch.cat(list(level)) for level in levels], dim=-1)
    assert [tuple(g) for _, g in ours] == [tuple(row) for row in grid.tolist()]
    got = torch.cat([embeddings for embeddings, _ in ours])
    assert got.shape == expected.shape
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert got.shape[1] == VisionLayout.of(model.config, tokenizer).embedding_width
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
