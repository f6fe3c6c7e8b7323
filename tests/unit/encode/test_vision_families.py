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


@pytest.mark.parametrize(("attention", "patch_embedding"), [("auto", "auto"), ("packed", "matmul")])
@pytest.mark.parametrize("family", [family.name for family in FAMILIES])
def test_the_tower_alone_equals_the_models_own_image_features(
    tiny_family_dir: Callable[[str], Path], family: str, attention: str, patch_embedding: str
) -> None:
    """Transformers' own execution (CPU's default) and the accelerator's default (packed
    attention, the patch embedding as a matrix product), forced here on CPU."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    model_dir = tiny_family_dir(family)
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)),
        Image.fromarray(rng.integers(0, 255, (90, 60, 3), dtype=np.uint8)),
    ]
    encoder = VisionEncoder(model_dir, attention=attention, patch_embedding=patch_embedding)
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


@pytest.mark.parametrize("family", [family.name for family in FAMILIES])
def test_images_prepared_one_at_a_time_give_the_batchs_embeddings(
    tiny_family_dir: Callable[[str], Path], family: str
) -> None:
    """The encode service prepares each image apart (in parallel, while the tower runs the
    previous batch) and joins them for one tower call: the same embeddings as the processor on
    the whole batch, for images of different sizes (LLaVA-OneVision: different tile counts)."""
    rng = np.random.default_rng(1)
    arrays = [
        rng.integers(0, 255, (64, 96, 3), dtype=np.uint8),
        rng.integers(0, 255, (90, 60, 3), dtype=np.uint8),
        rng.integers(0, 255, (40, 200, 3), dtype=np.uint8),
    ]
    encoder = VisionEncoder(tiny_family_dir(family))
    batch = encoder.encode([Image.fromarray(array) for array in arrays])
    apart = encoder.run([encoder.prepare(torch.from_numpy(array)) for array in arrays])
    assert [grid for _, grid in apart] == [grid for _, grid in batch]
    for (got, _), (expected, _) in zip(apart, batch, strict=True):
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
