"""A tiny Qwen3-VL checkpoint: patches of 16 merged 2 x 2, pixels normalised to [-1, 1],
interleaved M-RoPE (sections as the hub's, 24:20:20), DeepStack features after two of the tower's
blocks, a square grid of learned positions, the hub's chat template (no default system
turn), and a video processor budgeting pixels over the whole clip, as the hub's."""

from __future__ import annotations

from typing import Any

from epd.server.models.tiny.builder import TinySizes
from epd.server.models.tiny.qwen2_vl import (
    MERGE_SIZE,
    TEMPORAL_PATCH_SIZE,
    VIDEO_SAMPLING,
    QwenVlBuilder,
    merged_tower_config,
    qwen_chat_template,
)

PATCH_SIZE = 16
#: a clip's pixel budget in frames of the image processor's largest size (the hub's: 32)
VIDEO_BUDGET_FRAMES = 8


class Qwen3VlBuilder(QwenVlBuilder):
    """Tiny Qwen3-VL (``Qwen3VLForConditionalGeneration``), dense."""

    name = "qwen3_vl"
    processor_class = "Qwen3VLProcessor"
    config_class = "Qwen3VLConfig"
    model_class = "Qwen3VLForConditionalGeneration"
    # NOTE: as the hub's Qwen3-VL template: no default system turn.
    chat_template = qwen_chat_template(system_turn="")

    def _processors(self, sizes: TinySizes) -> tuple[Any, Any]:
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
        video_size = {
            "shortest_edge": sizes.min_pixels,
            "longest_edge": sizes.max_pixels * VIDEO_BUDGET_FRAMES,
        }
        return image_processor, Qwen3VLVideoProcessor(size=video_size, **patches, **VIDEO_SAMPLING)

    def _text_config(
        self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes
    ) -> dict[str, Any]:
        head_dim = sizes.hidden_size // sizes.num_heads
        text = super()._text_config(token_ids, vocab_size, sizes)
        text["head_dim"] = head_dim
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": mrope_section(head_dim),
            "mrope_interleaved": True,
        }
        return text

    def _vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        # NOTE: the hub's checkpoints take DeepStack features after 3 of 24-27 blocks, spread
        # out; a tiny tower takes them after blocks d/4 and d/2 (both blocks of a 2-block tower).
        depth = sizes.vision_depth
        return merged_tower_config(
            sizes,
            PATCH_SIZE,
            # a square grid of learned positions, resampled to each image's grid
            num_position_embeddings=16 * 16,
            deepstack_visual_indexes=sorted({depth // 4, depth // 2}),
        )


def mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen3-VL (24:20:20)."""
    half = head_dim // 2
    temporal = half * 24 // 64
    spatial = (half - temporal) // 2
    return [temporal, spatial, half - temporal - spatial]
