"""vLLM prompts for images given as embeddings: vLLM's public input named by content, and the
hand-rendered input of a family whose items vLLM's renderer makes wrongly (tokens, items,
names and placeholder ranges)."""

from __future__ import annotations

import torch

from epd.server.engine.base import EngineImage
from epd.server.engine.vllm_embeds import EMBEDS_HASH_PREFIX, embeddings_hash, embeddings_prompt
from tests.unit.engine.test_prompt_check import END, INTERNVL_LAYOUT, LAYOUT

PROMPT = [1, 5, 6, END, 2, 5, 6, END, 3]


def test_embeddings_go_to_vllm_as_its_public_input_with_the_prompt_unexpanded() -> None:
    first = EngineImage("a", (1, 2, 4), embeddings=torch.ones(2, 8))
    second = EngineImage("b", (1, 2, 2), embeddings=torch.full((1, 8), 2.0))
    prompt = embeddings_prompt("r", PROMPT, [first, second], LAYOUT)
    assert "type" not in prompt
    assert prompt["prompt_token_ids"] == PROMPT
    data = prompt["multi_modal_data"]["image"]
    assert data["image_embeds"][:, 0].tolist() == [1.0, 1.0, 2.0]
    assert data["image_grid_thw"].tolist() == [[1, 2, 4], [1, 2, 2]]
    assert len(prompt["multi_modal_uuids"]["image"]) == 2


def test_embeddings_are_named_by_their_content_not_by_the_callers_mm_hash() -> None:
    ones = torch.ones(2, 8)
    same = embeddings_prompt(
        "r",
        PROMPT,
        [EngineImage("a", (1, 2, 4), ones), EngineImage("b", (1, 2, 4), ones.clone())],
        LAYOUT,
    )
    names = same["multi_modal_uuids"]["image"]
    assert names[0] == names[1] and names[0].startswith(EMBEDS_HASH_PREFIX)
    other = torch.ones(2, 8)
    other[1, 7] = 1.5
    claimed = embeddings_prompt(
        "r", PROMPT, [EngineImage("a", (1, 2, 4), ones), EngineImage("a", (1, 2, 4), other)], LAYOUT
    )
    assert len(set(claimed["multi_modal_uuids"]["image"])) == 2


def test_the_name_covers_dtype_shape_and_grid() -> None:
    ones = torch.ones(4, 8)
    names = {
        embeddings_hash(ones, (1, 4, 4)),
        embeddings_hash(ones.to(torch.bfloat16), (1, 4, 4)),
        embeddings_hash(ones.view(2, 16), (1, 4, 4)),
        embeddings_hash(ones, (1, 2, 8)),
        embeddings_hash(ones, (1, 4, 4), "sha256"),
    }
    assert len(names) == 5
    assert embeddings_hash(ones.t().contiguous().t(), (1, 4, 4)) == embeddings_hash(ones, (1, 4, 4))


def test_grid_only_images_get_zero_rows_named_by_mm_hash_or_by_the_request() -> None:
    images = [EngineImage("h", (1, 2, 4)), EngineImage("", (1, 2, 2))]
    prompt = embeddings_prompt("req", PROMPT, images, LAYOUT)
    embeds = prompt["multi_modal_data"]["image"]["image_embeds"]
    assert tuple(embeds.shape) == (3, 8) and not embeds.any()
    assert prompt["multi_modal_uuids"]["image"] == ["h", "req-1"]


def test_a_family_with_items_of_its_own_gets_them_rendered_delimiters_outside_the_rows() -> None:
    """InternVL (items of its own: vLLM 0.32 batches its embeddings wrongly): each placeholder
    range covers ``<img>`` ... ``</img>``, with the rows marked ``is_embed`` (as vLLM's prompt
    update marks them); grid-only images get zero rows only."""
    layout = INTERNVL_LAYOUT
    images = [EngineImage("a", (1, 1, 2), torch.ones(2, 8)), EngineImage("b", (1, 1, 3))]
    engine_input = embeddings_prompt("r", [1, 6, 2, 6], images, layout)
    assert engine_input["type"] == "multimodal"
    assert engine_input["prompt_token_ids"] == [1, 10, 6, 6, 11, 2, 10, 6, 6, 6, 11]
    placeholders = engine_input["mm_placeholders"]["image"]
    assert [(p.offset, p.length) for p in placeholders] == [(1, 4), (6, 5)]
    assert [p.is_embed.tolist() for p in placeholders] == [
        [False, True, True, False],
        [False, True, True, True, False],
    ]
    assert [p.get_num_embeds() for p in placeholders] == [2, 3]
    items = engine_input["mm_kwargs"]["image"]
    assert [tuple(item["image_embeds"].data.shape) for item in items] == [(2, 8), (3, 8)]


def test_embeddings_bound_to_their_image_are_named_by_it_and_their_dtype() -> None:
    """Embeddings their encoder tagged with the image's mm_hash are named without hashing them:
    the same image in the same precision shares one name, another precision does not."""
    ones = torch.ones(2, 8)
    prompt = embeddings_prompt(
        "r",
        PROMPT,
        [
            EngineImage("ab" * 16, (1, 2, 4), ones, is_bound=True),
            EngineImage("ab" * 16, (1, 2, 4), ones.to(torch.bfloat16), is_bound=True),
        ],
        LAYOUT,
    )
    names = prompt["multi_modal_uuids"]["image"]
    assert names == [f"epd-mm-{'ab' * 16}-float32", f"epd-mm-{'ab' * 16}-bfloat16"]
