"""LLaVA-OneVision: rows per image from its size alone, the tower alone on tiled images, the items
vLLM batches, and prompts whose block hashes tell images apart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from epd.server.encode.vision import VisionEncoder
from epd.server.media.grid import ImageGridder
from epd.server.models.family import ROWS_KEY
from epd.server.models.llava_onevision import LlavaOnevision, num_image_rows
from epd.server.route.prompt import BLOCK_SIZE, PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ImageSource

FAMILY = LlavaOnevision()
# NOTE: (width, height): tiny, extreme aspect ratios, and large enough to be shrunk (> 9 tiles).
SIZES = [
    (96, 64),
    (10, 10),
    (1, 1),
    (1000, 30),
    (3000, 10),
    (5, 2000),
    (57, 113),
    (113, 57),
    (28, 28),
    (300, 200),
    (336, 224),
    (2000, 1500),
    (1000, 700),
]
HUB_SIZES = [(640, 480), (1153, 944), (384, 384), (4000, 300), (200, 3000), (1920, 1080)]


@pytest.fixture(scope="module")
def model_dir(tiny_family_dir: Callable[[str], Path]) -> Path:
    return tiny_family_dir(FAMILY.name)


def test_rows_follow_from_the_size_as_the_processor_counts_its_image_tokens(model_dir) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    gridder = ImageGridder(model_dir)
    counted = []
    for width, height in SIZES:
        image = Image.new("RGB", (width, height), (30, 60, 90))
        ids = processor(text="<image>", images=[image], return_tensors="pt")["input_ids"]
        counted.append(int((ids == processor.image_token_id).sum()))
    assert [gridder.grid_of_size(*size) for size in SIZES] == [(1, 1, n) for n in counted]
    # NOTE: 16 base rows (one 56-pixel tile), then the kept tile rows, one newline row each.
    assert counted[:3] == [70, 36, 36]


def test_rows_at_the_hubs_sizes_are_transformers_count(model_dir) -> None:
    """The hub's settings (384-pixel tiles of 27 x 27 rows, pinpoints up to 6 x 6 tiles): the
    processor's count from sizes alone, as it expands ``<image>``."""
    from transformers import (
        AutoTokenizer,
        LlavaOnevisionConfig,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    config = LlavaOnevisionConfig()
    image_processor = LlavaOnevisionImageProcessor()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(),
        num_image_tokens=729,
        vision_feature_select_strategy="full",
    )
    sizes = [(height, width) for width, height in HUB_SIZES]
    expected = processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    ours = [
        num_image_rows(w, h, config, image_processor.image_grid_pinpoints) for w, h in HUB_SIZES
    ]
    assert ours == expected
    assert ours[2] == 729 + 27 * 27 + 27


def test_the_tower_alone_packs_tiles_as_the_model_does(model_dir) -> None:
    """Images of different tile counts in one batch, one shrunk past 9 tiles' rows, one whose
    kept tiles hold no row."""
    from transformers import AutoModelForImageTextToText

    rng = np.random.default_rng(0)
    sizes = [(300, 200), (60, 90), (1000, 30), (113, 57)]
    images = [
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        for width, height in sizes
    ]
    encoder = VisionEncoder(model_dir)
    ours = encoder.encode(images)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    pixels, _ = encoder.preprocess(images)
    with torch.inference_mode():
        features = model.model.get_image_features(**pixels).pooler_output
    gridder = ImageGridder(model_dir)
    assert [grid for _, grid in ours] == [gridder.grid_of_size(*size) for size in sizes]
    assert [len(rows) for rows, _ in ours] == [len(rows) for rows in features] == [151, 72, 16, 94]
    for (rows, _), expected in zip(ours, features, strict=True):
        assert torch.allclose(rows, expected, atol=1e-5, rtol=1e-5)


def test_vllm_batches_only_images_of_equal_rows() -> None:
    """vLLM batches consecutive items of equal keys and shared fields; its OneVision embeddings
    schema refuses a batch of different row counts (the EngineCore dies), so the row count rides
    as a shared field."""
    from vllm.model_executor.models.llava_onevision import LlavaOnevisionImageEmbeddingInputs
    from vllm.multimodal.inputs import MultiModalKwargsItem
    from vllm.multimodal.utils import group_and_batch_mm_kwargs

    embeddings = [torch.randn(rows, 8) for rows in (70, 70, 72, 70)]
    items = FAMILY.vllm_items(embeddings, [(1, 1, len(e)) for e in embeddings])
    assert all(ROWS_KEY in item for item in items)
    batches = list(group_and_batch_mm_kwargs([("image", MultiModalKwargsItem(i)) for i in items]))
    assert [num_items for _, num_items, _ in batches] == [2, 1, 1]
    for _, _, kwargs in batches:
        LlavaOnevisionImageEmbeddingInputs(type="image_embeds", data=kwargs["image_embeds"])
    with pytest.raises(ValueError, match="inconsistent shapes"):
        LlavaOnevisionImageEmbeddingInputs(type="image_embeds", data=embeddings[1:3])


def test_prompts_hold_one_image_token_per_image_and_hash_images_apart(model_dir) -> None:
    builder = PromptBuilder(model_dir)
    image = ImageSource(url="u")
    parts = [ChatPart(image=image), ChatPart(text="compare"), ChatPart(image=image)]
    ids = builder.token_ids([ChatMessage("user", parts)])
    assert ids.count(builder.image_pad_id) == 2
    assert builder.tokenizer.decode(ids).count("<image>\n") == 2
    rows = [70, 72]
    same = builder.block_hashes(ids, [("aa11", rows[0]), ("bb22", rows[1])])
    assert len(same) == (len(ids) - 2 + sum(rows)) // BLOCK_SIZE
    assert builder.block_hashes(ids, [("aa11", rows[0]), ("cc33", rows[1])]) != same
    assert same[0] != builder.block_hashes(ids, [("bb22", rows[0]), ("aa11", rows[1])])[0]
