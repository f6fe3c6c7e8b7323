"""Our rendering of an embeddings prompt is what vLLM's own renderer makes of it (names aside),
for every family; embeddings of the wrong width are refused before vLLM sees them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage, Sampling
from epd.server.media.grid import ImageGridder
from epd.server.models.family import ROWS_KEY
from epd.server.models.registry import FAMILIES
from tests.families import skip_unless_run

pytestmark = pytest.mark.vllm
SIZES = [(336, 224), (168, 112)]


@pytest.fixture(scope="module", params=[family.name for family in FAMILIES])
async def family_engine(request: pytest.FixtureRequest, tiny_family_dir, engines) -> AsyncIterator:
    """A vLLM engine on each family's tiny checkpoint (the default family's: the session's)."""
    skip_unless_run(request, request.param)
    if request.param == FAMILIES[0].name:
        yield engines[0]
        return
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

    options = VllmOptions(kv_cache_bytes=64 << 20, max_model_len=2048)
    engine = await VllmEngine.start(tiny_family_dir(request.param), options=options)
    yield engine
    await engine.close()


def vllm_render(engine, token_ids: list[int], images: list[EngineImage]):
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    llm = engine._llm
    family = engine.layout.family
    data = family.vllm_data(
        [image.embeddings for image in images], [image.grid for image in images]
    )
    prompt = {"prompt_token_ids": token_ids, "multi_modal_data": {"image": data}}
    renderer = llm.renderer
    (engine_input,) = renderer.render_cmpl(
        [parse_model_prompt(llm.model_config, prompt)], renderer.default_cmpl_tok_params
    )
    return engine_input


def two_images(engine, width: int) -> tuple[list[int], list[EngineImage]]:
    layout = engine.layout
    gridder = ImageGridder(engine.model_dir)
    grids = [gridder.grid_of_size(width, height) for width, height in SIZES]
    images = [
        EngineImage(f"h{i}", (t, h, w), torch.randn(t * h * w // layout.merge_size**2, width))
        for i, (t, h, w) in enumerate(grids)
    ]
    start = [] if layout.vision_start_id is None else [layout.vision_start_id]
    group = [*start, layout.image_pad_id, 9]  # NOTE: one image's placeholder, then a text token
    return [1, 2, *group, 3, *group, 4], images


async def test_two_images_render_as_vllm_renders_them(family_engine) -> None:
    """What the engine hands vLLM is what vLLM's renderer makes of the family's public input
    (items of its own included, but for their extra keys), and its placeholders expand as the
    family's layout says (the route's block hashes and the engines' checks count on that)."""
    engine = family_engine
    token_ids, images = two_images(engine, engine.layout.embedding_width)

    ours = await engine._render("r", token_ids, images)
    theirs = vllm_render(engine, token_ids, images)

    assert ours["type"] == theirs["type"] == "multimodal"
    expanded, ranges = engine.layout.expand_with_ranges(token_ids, images)
    assert ours["prompt_token_ids"] == theirs["prompt_token_ids"] == expanded
    assert ours["mm_placeholders"] == theirs["mm_placeholders"]
    assert [(p.offset, p.length) for p in ours["mm_placeholders"]["image"]] == ranges
    our_items, their_items = ours["mm_kwargs"]["image"], theirs["mm_kwargs"]["image"]
    assert len(our_items) == len(their_items) == 2
    for our_item, their_item in zip(our_items, their_items, strict=True):
        assert our_item.keys() - {ROWS_KEY} == their_item.keys()  # NOTE: the model ignores it
        for key in their_item:
            ours_elem, theirs_elem = our_item[key], their_item[key]
            assert ours_elem == theirs_elem, key
            assert ours_elem.data.dtype == theirs_elem.data.dtype, key
            assert ours_elem.field == theirs_elem.field, key
    assert len(set(ours["mm_hashes"]["image"])) == 2


async def test_embeddings_of_another_width_are_refused_and_the_engine_serves_on(
    family_engine,
) -> None:
    """Qwen3-VL's rows carry its DeepStack levels; the main features alone (the text model's
    width) kill vLLM's EngineCore (split_with_sizes in its DeepStack split), so the engine's check
    refuses them as INVALID_ARGUMENT. The two images differ in size: LLaVA-OneVision's rows
    too, which vLLM's embeddings schema refuses in one batch (its EngineCore died)."""
    from transformers import AutoConfig

    engine = family_engine
    width = engine.layout.embedding_width
    text_width = AutoConfig.from_pretrained(engine.model_dir).get_text_config().hidden_size
    sampling = Sampling(max_tokens=2, temperature=0.0, ignore_eos=True)
    for wrong in {width - 1, width + 1, text_width} - {width}:
        token_ids, images = two_images(engine, wrong)
        with pytest.raises(InvalidArgument) as caught:
            async for _ in engine.generate("narrow", token_ids, images, sampling):
                pass
        assert caught.value.reason == "EMBEDDING_SHAPE_MISMATCH"
    token_ids, images = two_images(engine, width)
    tokens = [
        t
        async for chunk in engine.generate("right", token_ids, images, sampling)
        for t in chunk.token_ids
    ]
    assert len(tokens) == 2
