"""Qwen3-VL: Qwen2-VL's placeholder group, resize rule (patches of 16, merged 2 x 2) and image
fields, with DeepStack. The vision tower gives, besides the merger's output, one merged feature
map per ``deepstack_visual_indexes`` layer; each is added to the language model's hidden states at
the image positions after decoder layer 0, 1, ... An image's embeddings therefore travel as one
tensor, [tokens, out_hidden_size x (1 + deepstack levels)]: the main rows, then each level's, on
the last axis, which is exactly what vLLM takes as ``image_embeds`` (and splits itself).
"""

from __future__ import annotations

from typing import Any

from epd.server.models.family import TinySizes
from epd.server.models.qwen2_vl import (
    MERGE_SIZE,
    TEMPORAL_PATCH_SIZE,
    _QwenVl,
    qwen_chat_template,
)

PATCH_SIZE = 16

# NOTE: as the hub's Qwen3-VL template: no default system turn.
CHAT_TEMPLATE = qwen_chat_template(system_turn="")


class Qwen3Vl(_QwenVl):
    """Qwen3-VL (``Qwen3VLForConditionalGeneration``), dense."""

    name = "qwen3_vl"
    title = "Qwen3-VL"
    architectures = ("Qwen3VLForConditionalGeneration",)
    chat_template = CHAT_TEMPLATE

    def _vision_tower_class(self) -> Any:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        return Qwen3VLVisionModel

    def embedding_width(self, config: Any) -> int:
        vision = config.vision_config
        return int(vision.out_hidden_size) * (1 + len(vision.deepstack_visual_indexes))

    def image_embeddings(self, tower: Any, pixel_values: Any, grid: Any) -> Any:
        import torch

        output = tower(pixel_values, grid_thw=grid)
        return torch.cat([output.pooler_output, *output.deepstack_features], dim=-1)

    def language_model_inputs(
        self, inputs_embeds: Any, is_image: Any, embeddings: Any
    ) -> tuple[Any, dict[str, Any]]:
        rows = embeddings.to(inputs_embeds.device, inputs_embeds.dtype)
        main, *levels = rows.split(inputs_embeds.shape[-1], dim=-1)
        embeds = inputs_embeds.masked_scatter(is_image.unsqueeze(-1), main)
        return embeds, {"visual_pos_masks": is_image, "deepstack_visual_embeds": levels}

    def _tiny_processors(self, sizes: TinySizes) -> tuple[Any, Any]:
        from transformers import Qwen2VLImageProcessor, Qwen3VLVideoProcessor

        patches = dict(
            patch_size=PATCH_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE, merge_size=MERGE_SIZE
        )
        # NOTE: the hub's Qwen3-VL processors normalise to [-1, 1] (mean and std 0.5).
        image_processor = Qwen2VLImageProcessor(
            size={"shortest_edge": sizes.min_pixels, "longest_edge": sizes.max_pixels},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            **patches,
        )
        return image_processor, Qwen3VLVideoProcessor(**patches)

    def _tiny_text_config(
        self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes
    ) -> dict[str, Any]:
        head_dim = sizes.hidden_size // sizes.num_heads
        text = super()._tiny_text_config(token_ids, vocab_size, sizes)
        text["head_dim"] = head_dim
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": mrope_section(head_dim),
            "mrope_interleaved": True,
        }
        return text

    def _config_class(self) -> Any:
        from transformers import Qwen3VLConfig

        return Qwen3VLConfig

    def _processor_class(self) -> Any:
        from transformers import Qwen3VLProcessor

        return Qwen3VLProcessor

    def _model_class(self) -> Any:
        from transformers import Qwen3VLForConditionalGeneration

        return Qwen3VLForConditionalGeneration

    def _tiny_vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        # NOTE: the hub's checkpoints take DeepStack features after 3 of 24-27 blocks, spread
        # out; a tiny tower takes them after blocks d/4 and d/2 (both blocks of a 2-block tower).
        depth = sizes.vision_depth
        return dict(
            depth=depth,
            hidden_size=sizes.vision_embed_dim,
            intermediate_size=2 * sizes.vision_embed_dim,
            num_heads=sizes.vision_num_heads,
            out_hidden_size=sizes.hidden_size,
            patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            # a square grid of learned positions, resampled to each image's grid
            num_position_embeddings=16 * 16,
            deepstack_visual_indexes=sorted({depth // 4, depth // 2}),
            in_channels=3,
            initializer_range=sizes.init_range,
        )


def mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen3-VL (24:20:20)."""
    half = head_dim // 2
    temporal = half * 24 // 64
    spatial = (half - temporal) // 2
    return [temporal, spatial, half - temporal - spatial]
