"""VisionLayout: placeholder counts, embedding shapes against grids (at the family's width),
grid-only images."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from PIL import Image

from epd.common.errors import Code, InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.engine.prompt_check import VisionLayout
from epd.server.models.registry import UnsupportedModel, family_named
from tests.engines import QWEN_LAYOUT as LAYOUT

END = 7
# InternVL's: image token 6 alone, each image's rows between <img> (10) and </img> (11)
INTERNVL_LAYOUT = VisionLayout(
    None,
    6,
    merge_size=1,
    embedding_width=8,
    family=family_named("internvl"),
    image_start_ids=(10,),
    image_end_ids=(11,),
)


def prompt(num_images: int) -> list[int]:
    return [1, 2] + [5, 6, END] * num_images + [3]


def embedded(grid: tuple[int, int, int], rows: int | None = None) -> EngineImage:
    num_rows = rows if rows is not None else grid[0] * grid[1] * grid[2] // 4
    return EngineImage("h", grid, embeddings=torch.zeros(num_rows, 8))


def reason_of(token_ids, images, max_len=100, **kwargs) -> str:
    with pytest.raises(InvalidArgument) as caught:
        LAYOUT.check(token_ids, images, max_len, **kwargs)
    return caught.value.reason


def test_matching_prompt_and_images_pass() -> None:
    LAYOUT.check(prompt(2), [embedded((1, 4, 6)), embedded((1, 2, 2))], 100)
    LAYOUT.check(prompt(1), [EngineImage("h", image=Image.new("RGB", (8, 8)))], 100)
    LAYOUT.check(prompt(0), [], 100)


def test_count_placeholders_counts_start_pad_pairs_only() -> None:
    assert LAYOUT.count_placeholders([5, 6, 7, 5, 1, 6, 5, 6]) == (2, 0)
    videos = VisionLayout(
        5, 6, merge_size=2, embedding_width=8, family=family_named("qwen2_vl"), video_pad_id=9
    )
    assert videos.count_placeholders([5, 6, 5, 9, 9, 1, 9, 5, 9]) == (1, 2)


def test_bad_prompts_and_images_are_named() -> None:
    assert reason_of([], []) == "EMPTY_PROMPT"
    assert reason_of(prompt(2), [embedded((1, 2, 2))]) == "IMAGE_COUNT_MISMATCH"
    assert reason_of(prompt(1), [embedded((1, 4, 4), rows=3)]) == "EMBEDDING_SHAPE_MISMATCH"
    wide = EngineImage("h", (1, 2, 2), embeddings=torch.zeros(1, 9))
    assert reason_of(prompt(1), [wide]) == "EMBEDDING_SHAPE_MISMATCH"
    assert (
        reason_of(prompt(1), [EngineImage("h", (1, 0, 2), embeddings=torch.zeros(0, 8))])
        == "BAD_GRID"
    )
    assert reason_of(prompt(1), [EngineImage("h")]) == "MISSING_IMAGE_DATA"
    assert reason_of(prompt(1), [embedded((1, 20, 20))], max_len=100) == "PROMPT_TOO_LONG"


def test_grid_only_images_need_the_flag_and_a_whole_grid() -> None:
    grid_only = [EngineImage("h", (1, 4, 4))]
    assert reason_of(prompt(1), grid_only) == "MISSING_IMAGE_DATA"
    LAYOUT.check(prompt(1), grid_only, 100, grids_suffice=True)
    odd = [EngineImage("h", (1, 3, 3))]
    assert reason_of(prompt(1), odd, grids_suffice=True) == "BAD_GRID"
    assert reason_of(prompt(1), [EngineImage("h")], grids_suffice=True) == "BAD_GRID"


def test_expand_repeats_each_placeholder_to_its_embedding_rows() -> None:
    images = [embedded((1, 4, 6)), EngineImage("h", (1, 2, 2))]
    expanded = LAYOUT.expand(prompt(2), images)
    assert expanded == [1, 2, 5, *[6] * 6, END, 5, 6, END, 3]
    assert LAYOUT.expand([1, 6, 5, 2], []) == [1, 6, 5, 2]


def family_config(architecture: str) -> Any:
    """A transformers config of ``architecture`` with tiny sizes (no weights)."""
    from transformers import Qwen2VLConfig, Qwen3VLConfig

    ids = {"vision_start_token_id": 5, "image_token_id": 6, "architectures": [architecture]}
    if architecture.startswith("Qwen3VL"):
        vision = {"out_hidden_size": 16, "deepstack_visual_indexes": [0, 1], "depth": 2}
        return Qwen3VLConfig(text_config={"hidden_size": 16}, vision_config=vision, **ids)
    return Qwen2VLConfig(text_config={"hidden_size": 16}, **ids)


def test_embedding_width_and_family_are_the_familys() -> None:
    assert VisionLayout.of(family_config("Qwen2VLForConditionalGeneration")).embedding_width == 16
    # NOTE: Qwen3-VL's rows carry its two DeepStack levels beside the main features.
    qwen3 = VisionLayout.of(family_config("Qwen3VLForConditionalGeneration"))
    assert qwen3.embedding_width == 48
    assert qwen3.family is family_named("qwen3_vl")
    with pytest.raises(UnsupportedModel, match="Gemma3ForConditionalGeneration is not supported"):
        VisionLayout.of(family_config("Gemma3ForConditionalGeneration"))


def test_an_image_token_alone_is_a_placeholder_where_the_family_has_no_start_token() -> None:
    """LLaVA-1.5: each image token is one image, expanded to its (1, 1, rows) grid's rows."""
    layout = VisionLayout(None, 6, merge_size=1, embedding_width=8, family=family_named("llava"))
    images = [EngineImage("a", (1, 1, 3), torch.zeros(3, 8)), EngineImage("b", (1, 1, 2), None)]
    token_ids = [1, 6, 2, 6, 3]
    assert layout.count_placeholders(token_ids) == (2, 0)
    assert layout.expand(token_ids, images) == [1, 6, 6, 6, 2, 6, 6, 3]
    layout.check(token_ids, images, max_len=64, grids_suffice=True)


def test_embeddings_without_the_deepstack_levels_are_refused() -> None:
    """vLLM's model runner crashes on Qwen3-VL rows narrower than main + DeepStack levels; the
    check refuses them first, as INVALID_ARGUMENT."""
    layout = VisionLayout.of(family_config("Qwen3VLForConditionalGeneration"))
    main_only = EngineImage("h", (1, 4, 4), embeddings=torch.zeros(4, 16))
    with pytest.raises(InvalidArgument) as caught:
        layout.check(prompt(1), [main_only], 100)
    assert caught.value.reason == "EMBEDDING_SHAPE_MISMATCH"
    assert caught.value.code == Code.INVALID_ARGUMENT
    assert "expected [4, 48]" in str(caught.value)
    layout.check(prompt(1), [EngineImage("h", (1, 4, 4), embeddings=torch.zeros(4, 48))], 100)


def test_delimiters_wrap_each_images_rows_and_count_toward_the_limit() -> None:
    """InternVL: ``<IMG_CONTEXT>`` alone per image, expanded to ``<img>``, the rows, ``</img>``."""
    layout = INTERNVL_LAYOUT
    images = [EngineImage("a", (1, 1, 3), torch.zeros(3, 8)), EngineImage("b", (1, 1, 2), None)]
    token_ids = [1, 6, 2, 6, 3]
    assert layout.count_placeholders(token_ids) == (2, 0)
    expanded, ranges = layout.expand_with_ranges(token_ids, images)
    assert expanded == [1, 10, 6, 6, 6, 11, 2, 10, 6, 6, 11, 3]
    assert ranges == [(1, 5), (7, 4)]
    layout.check(token_ids, images, max_len=13, grids_suffice=True)
    with pytest.raises(InvalidArgument) as caught:
        layout.check(token_ids, images, max_len=12, grids_suffice=True)
    assert caught.value.reason == "PROMPT_TOO_LONG"
