"""InternVL in transformers format (``InternVLForConditionalGeneration``, the hub's ``-hf``
checkpoints such as InternVL3-1B-hf): an InternViT tower whose last hidden states less the CLS
row are pixel-shuffled (``downsample_ratio`` 0.5: 2 x 2 patches per row) and go through
``multi_modal_projector``, as transformers' ``InternVLModel.get_image_features``.

An image becomes tiles of the tower's square: the processor picks the tile grid whose aspect
ratio is closest to the image's (between ``min_patches`` and ``max_patches`` tiles) and adds a
thumbnail of the whole image when there is more than one tile. Every tile gives the same rows,
(side / patch) ** 2 x ratio ** 2 (256 on the hub's 448-pixel tower), so an image's rows come from
its size alone; its grid travels as (1, 1, rows) with a merge size of 1, positions are 1-D.

The chat template emits ``<IMG_CONTEXT>`` once per image; engines expand it to ``<img>``, the
image's rows of ``<IMG_CONTEXT>``, ``</img>`` (the processor's ``replace_image_token``, vLLM's
prompt update), so the family names those delimiters (``image_delimiters``). Embeddings enter vLLM
(``InternS1ForConditionalGeneration`` serves the architecture) as ``image_embeds``, one [rows,
hidden] tensor per image (a batched field), with the rows as a shared field so that vLLM never
batches images of different rows, which its schema refuses
(``family.SeparatelyBatchedFamily``). Hub checkpoints name the weights as transformers 5 saves
them (``model.vision_tower.*``, ``model.multi_modal_projector.*``, ``model.language_model.*``,
``lm_head.*``).
"""

from __future__ import annotations

from typing import Any

from epd.server.models.family import (
    Grid,
    SeparatelyBatchedFamily,
)
from epd.server.models.projected_tower import projected_tower

CONTEXT_TOKEN = "<IMG_CONTEXT>"
START_TOKEN = "<img>"
END_TOKEN = "</img>"


class InternVl(SeparatelyBatchedFamily):
    """InternVL, transformers format (``InternVLForConditionalGeneration``)."""

    name = "internvl"
    title = "InternVL"
    architectures = ("InternVLForConditionalGeneration",)
    visual_prefixes = (
        "model.vision_tower.",
        "model.multi_modal_projector.",
        "vision_tower.",
        "multi_modal_projector.",
    )

    def vision_tower(self, config: Any) -> Any:
        from transformers import InternVLVisionModel
        from transformers.models.internvl.modeling_internvl import InternVLMultiModalProjector

        return projected_tower(
            config,
            InternVLVisionModel._from_config(config.vision_config),
            InternVLMultiModalProjector(config),
        )

    def visual_weight_name(self, key: str) -> str | None:
        name = key.removeprefix("model.")
        is_visual = name.startswith(("vision_tower.", "multi_modal_projector."))
        return name if is_visual else None

    def model_tower(self, model: Any) -> Any:
        return model.model

    def image_delimiters(
        self, config: Any, tokenizer: Any
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if tokenizer is None:
            raise ValueError("InternVL's image delimiters (<img>, </img>) need its tokenizer")
        start, end = tokenizer.convert_tokens_to_ids([START_TOKEN, END_TOKEN])
        if tokenizer.unk_token_id in (start, end) or None in (start, end):
            raise ValueError(f"the tokenizer has no {START_TOKEN} or {END_TOKEN} token")
        return (int(start),), (int(end),)

    def image_embeddings(self, tower: Any, pixel_values: Any, grid: Any) -> Any:
        """As transformers' ``InternVLModel.get_image_features``: the tower's hidden states at
        ``vision_feature_layer``, less CLS for 'default', pixel-shuffled by
        ``downsample_ratio``, through the projector; [tiles x rows per tile, hidden]."""
        config = tower.config
        layer = config.vision_feature_layer
        output = tower.vision_tower(pixel_values=pixel_values, output_hidden_states=layer != -1)
        features = output.last_hidden_state if layer == -1 else output.hidden_states[layer]
        if config.vision_feature_select_strategy == "default":
            features = features[:, 1:]
        num_tiles, num_patches, _ = features.shape
        side = int(num_patches**0.5)
        features = pixel_shuffle(
            features.reshape(num_tiles, side, side, -1), config.downsample_ratio
        )
        features = features.reshape(num_tiles, -1, features.shape[-1])
        return tower.multi_modal_projector(features).flatten(0, 1)

    def image_grid(self, width: int, height: int, config: Any, processor: Any) -> Grid:
        num_tiles = processor.get_number_of_image_patches(height, width, _images_kwargs())
        return 1, 1, int(num_tiles) * rows_per_tile(config)

    def pixel_inputs(
        self, processor: Any, images: list[Any], config: Any, device: str | None = None
    ) -> tuple[Any, Any]:
        import torch

        inputs = processor(images=images, return_tensors="pt", **_images_kwargs(), device=device)
        rows = rows_per_tile(config)
        grids = [(1, 1, int(num_tiles) * rows) for num_tiles in inputs["num_patches"]]
        return inputs["pixel_values"], torch.tensor(grids)


def rows_per_tile(config: Any) -> int:
    """Embedding rows of one tile: the tower's patches, pixel-shuffled by ``downsample_ratio``."""
    height, width = config.vision_config.image_size
    patch_height, patch_width = config.vision_config.patch_size
    return int((height // patch_height) * (width // patch_width) * config.downsample_ratio**2)


def pixel_shuffle(features: Any, ratio: float) -> Any:
    """transformers' ``InternVLModel.pixel_shuffle``: [n, w, h, c] to [n, w x ratio, h x ratio,
    c / ratio**2]."""
    n, width, height, channels = features.shape
    features = features.reshape(n, width, int(height * ratio), int(channels / ratio))
    features = features.permute(0, 2, 1, 3).contiguous()
    features = features.reshape(
        n, int(height * ratio), int(width * ratio), int(channels / ratio**2)
    )
    return features.permute(0, 2, 1, 3).contiguous()


def _images_kwargs() -> dict[str, Any]:
    # NOTE: InternVLProcessor's own defaults (crop_to_patches=True) win over the image
    # processor's saved settings (the hub's says False); the processor, transformers generate
    # and vLLM tile with them, so the tower's pixels and the route's counts do too.
    from transformers.models.internvl.processing_internvl import InternVLProcessorKwargs

    return dict(InternVLProcessorKwargs._defaults.get("images_kwargs", {}))
