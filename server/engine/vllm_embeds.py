"""vLLM engine inputs for prompts whose images come as embeddings, or as grids only (decode).

vLLM's renderer runs every multimodal prompt through the model's processor pipeline: parse the
data, a passthrough "processing" of the embeddings, field configs, prompt updates that expand
each placeholder, and a hash of the embeddings by its framed serializer. For one tiny image that
is ~2 ms here, on a hop to the renderer's thread, in front of every prefill. What it produces for
the Qwen families' embeddings (rows of the layout's ``embedding_width``, whatever the family
carries in them) is simple: the prompt with each image's placeholder expanded to its rows and,
per image, an item of the family's fields (``ModelFamily.vllm_items``: Qwen families
``{image_embeds: flat field, image_grid_thw: batched field}``, LLaVA-1.5 ``{image_embeds: batched
field}``), a hash and a placeholder range. ``embeddings_input`` builds exactly that (a test
compares it with the renderer's output for every family) and vLLM takes it as a rendered
``EngineInput``, with no thread hop.

Names: real embeddings are named by a hash of their bytes, dtype, shape and grid, so vLLM's
caches (processor, encoder, prefix) share an entry only between equal embeddings whatever a
caller claims. Grid-only images (decode after a remote prefill: their KV is pulled, never
recomputed) get zero embeddings of the right shape, so vLLM lays out positions as the prefill did,
named by the route's ``mm_hash``, else uniquely per request, as before.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from epd.server.engine.base import EngineImage
from epd.server.engine.prompt_check import VisionLayout

EMBEDS_HASH_PREFIX = "epd-embeds-"


def embeddings_input(request_id: str, token_ids: list[int], images: list[EngineImage],
                     layout: VisionLayout, hash_algorithm: str = "blake3"
                     ) -> dict[str, Any]:  # fmt: skip
    """A vLLM ``MultiModalInput`` for a prompt whose images have embeddings or grids only.

    Call ``layout.check`` first: every image needs a valid grid, and its embeddings (if any)
    the rows that grid gives.
    """
    from vllm.inputs.engine import mm_input
    from vllm.multimodal.inputs import MultiModalKwargsItem, MultiModalKwargsItems, PlaceholderRange

    from epd.server.models.registry import family_named

    expanded, ranges = layout.expand_with_ranges(token_ids, images)
    embeddings, grids, hashes = [], [], []
    for index, (image, (_, length)) in enumerate(zip(images, ranges, strict=True)):
        assert image.grid is not None  # checked by VisionLayout.check
        embeds = image.embeddings
        if embeds is None:
            embeds = torch.zeros(length - layout.num_delimiters, layout.embedding_width)
            hashes.append(image.mm_hash or f"{request_id}-{index}")
        else:
            hashes.append(embeddings_hash(embeds, image.grid, hash_algorithm))
        embeddings.append(embeds)
        grids.append(image.grid)
    fields = family_named(layout.family).vllm_items(embeddings, grids)
    items = [MultiModalKwargsItem(item) for item in fields]
    placeholders = [
        PlaceholderRange(offset=offset, length=length, is_embed=_rows_mask(layout, length))
        for offset, length in ranges
    ]
    engine_input: dict[str, Any] = mm_input(expanded, MultiModalKwargsItems({"image": items}),
                                            {"image": hashes}, {"image": placeholders})  # type: ignore[assignment]  # fmt: skip
    return engine_input


def _rows_mask(layout: VisionLayout, length: int) -> torch.Tensor | None:
    """Which tokens of a placeholder run of ``length`` take embedding rows (vLLM's
    ``is_embed``): None where the run is rows alone, else all but the delimiters."""
    if not layout.num_delimiters:
        return None
    mask = torch.zeros(length, dtype=torch.bool)
    mask[len(layout.image_start_ids) : length - len(layout.image_end_ids)] = True
    return mask


def embeddings_hash(embeds: torch.Tensor, grid: tuple[int, int, int],
                    algorithm: str = "blake3") -> str:  # fmt: skip
    """A name for ``embeds`` at ``grid`` that only equal embeddings share.

    ``algorithm``: the engine's multimodal hash (vLLM's ``mm_hasher_algorithm``: blake3, sha256
    or sha512).
    """
    if algorithm == "blake3":
        from blake3 import blake3

        hasher: Any = blake3()
    else:
        hasher = hashlib.new(algorithm)
    header = f"{embeds.dtype}:{list(embeds.shape)}:{list(grid)}:"
    hasher.update(header.encode())
    payload = embeds.detach().cpu().contiguous()
    if payload.numel():
        hasher.update(payload.view(-1).view(torch.uint8).numpy())
    digest: str = hasher.hexdigest()
    return EMBEDS_HASH_PREFIX + digest
