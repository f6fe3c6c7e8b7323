"""LLaVA-1.5: a CLIP vision tower, whose hidden states at ``vision_feature_layer`` (-2) less the
CLS row (``vision_feature_select_strategy`` 'default') go through ``multi_modal_projector``. Every
image is resized and cropped to the tower's square, so it takes a fixed number of rows,
(crop / patch) ** 2 (576 for the hub's 336-pixel tower), whatever its size. The chat template
emits ``<image>`` once per image and engines expand it to those rows; positions are 1-D.

No patch grid travels: an image's grid is (1, 1, rows) with a merge size of 1, so the route,
encoders and engines count rows as for every family and the protos stay as they are. Embeddings
enter vLLM as ``image_embeds``, one [rows, hidden] tensor per image (a batched field).

Hub checkpoints name the tower's weights ``vision_tower.vision_model.*``, the projector's
``multi_modal_projector.*`` and the language model's ``language_model.*``, which both vLLM's
loader and transformers 5 read (the tiny builder, ``tiny/llava.py``, saves them so too).
"""

from __future__ import annotations

from typing import Any

from epd.server.models.family import (
    Grid,
    ModelFamily,
    image_size,
)
from epd.server.models.projected_tower import projected_tower


class Llava(ModelFamily):
    """LLaVA-1.5 (``LlavaForConditionalGeneration`` with a CLIP tower)."""

    name = "llava"
    title = "LLaVA-1.5"
    architectures = ("LlavaForConditionalGeneration",)
    visual_prefixes = (
        "vision_tower.",
        "multi_modal_projector.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
    )

    def vision_tower(self, config: Any) -> Any:
        from transformers import CLIPVisionModel
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        return projected_tower(
            config,
            CLIPVisionModel._from_config(config.vision_config),
            LlavaMultiModalProjector(config),
        )

    def visual_weight_name(self, key: str) -> str | None:
        name = key.removeprefix("model.")
        if name.startswith("vision_tower."):
            inner = name.removeprefix("vision_tower.").removeprefix("vision_model.")
            return "vision_tower." + inner
        return name if name.startswith("multi_modal_projector.") else None

    def model_tower(self, model: Any) -> Any:
        return model.model

    def image_embeddings(self, tower: Any, pixel_values: Any, grid: Any) -> Any:
        """As transformers' ``LlavaModel.get_image_features``: the tower's hidden states at
        ``vision_feature_layer`` (each of a list, concatenated), less CLS for 'default', through
        the projector; [num_images x rows, hidden]."""
        import torch

        config = tower.config
        layers = config.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else list(layers)
        hidden = tower.vision_tower(pixel_values, output_hidden_states=True).hidden_states
        chosen = [hidden[layer] for layer in layers]
        if config.vision_feature_select_strategy == "default":
            chosen = [states[:, 1:] for states in chosen]
        return tower.multi_modal_projector(torch.cat(chosen, dim=-1)).flatten(0, 1)

    def image_grid(self, width: int, height: int, config: Any, processor: Any) -> Grid:
        # NOTE: processing_llava's count: patches of the cropped square, + CLS, - CLS if default.
        size = processor.crop_size if processor.do_center_crop else processor.size
        patch_size = int(config.vision_config.patch_size)
        rows = (int(size["height"]) // patch_size) * (int(size["width"]) // patch_size)
        if config.vision_feature_select_strategy != "default":
            rows += 1
        return 1, 1, rows

    def pixel_inputs(
        self, processor: Any, images: list[Any], config: Any, device: str | None = None
    ) -> tuple[Any, Any]:
        import torch

        inputs = processor(images=images, return_tensors="pt", device=device)
        grids = [self.image_grid(*image_size(image), config, processor) for image in images]
        return inputs["pixel_values"], torch.tensor(grids)

    def vllm_data(self, embeddings: list[Any], grids: list[Grid]) -> Any:
        import torch

        # NOTE: vLLM's LLaVA parser takes embeddings as the image data itself, [images, rows,
        # hidden]; a dict ({"image_embeds": ...}) is taken for an image source and refused.
        return torch.stack(embeddings)
