"""Our rendering of an embeddings prompt is what vLLM's own renderer makes of it (names aside)."""

from __future__ import annotations

import pytest
import torch

from epd.server.engine.base import EngineImage
from epd.server.engine.vllm_embeds import embeddings_input

pytestmark = pytest.mark.vllm


def vllm_render(engine, token_ids: list[int], images: list[EngineImage]):
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    llm = engine._llm
    data = {"image_embeds": torch.cat([image.embeddings for image in images]),
            "image_grid_thw": torch.tensor([image.grid for image in images])}  # fmt: skip
    prompt = {"prompt_token_ids": token_ids, "multi_modal_data": {"image": data}}
    renderer = llm.renderer
    (engine_input,) = renderer.render_cmpl([parse_model_prompt(llm.model_config, prompt)],
                                           renderer.default_cmpl_tok_params)  # fmt: skip
    return engine_input


async def test_two_images_render_as_vllm_renders_them(engines) -> None:
    engine = engines[0]
    layout = engine.layout
    grids = [(1, 8, 12), (1, 4, 6)]
    images = [EngineImage(f"h{i}", grid, torch.randn(t * h * w // layout.merge_size**2,
                                                     layout.hidden_size))
              for i, (grid, (t, h, w)) in enumerate(zip(grids, grids, strict=True))]  # fmt: skip
    group = [layout.vision_start_id, layout.image_pad_id, 9]
    token_ids = [1, 2, *group, 3, *group, 4]

    ours = embeddings_input("r", token_ids, images, layout)
    theirs = vllm_render(engine, token_ids, images)

    assert ours["type"] == theirs["type"] == "multimodal"
    assert ours["prompt_token_ids"] == theirs["prompt_token_ids"]
    assert ours["mm_placeholders"] == theirs["mm_placeholders"]
    our_items, their_items = ours["mm_kwargs"]["image"], theirs["mm_kwargs"]["image"]
    assert len(our_items) == len(their_items) == 2
    for our_item, their_item in zip(our_items, their_items, strict=True):
        assert our_item.keys() == their_item.keys()
        for key in our_item:
            ours_elem, theirs_elem = our_item[key], their_item[key]
            assert ours_elem == theirs_elem, key
            assert ours_elem.data.dtype == theirs_elem.data.dtype, key
            assert ours_elem.field == theirs_elem.field, key
    assert len(set(ours["mm_hashes"]["image"])) == 2
