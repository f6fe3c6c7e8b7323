"""Qwen3-VL: Qwen2-VL's placeholder group, resize rule (patches of 16, merged 2 x 2) and image
fields, with DeepStack. The vision tower gives, besides the merger's output, one merged feature
map per ``deepstack_visual_indexes`` layer; each is added to the language model's hidden states at
the image positions after decoder layer 0, 1, ... An image's embeddings therefore travel as one
tensor, [tokens, out_hidden_size x (1 + deepstack levels)]: the main rows, then each level's, on
the last axis, which is exactly what vLLM takes as ``image_embeds`` (and splits itself).

Its video processor budgets pixels over the whole clip (``qwen_video.whole_clip_resized``), and
its prompt shows each temporal patch's time, the mean of its frames' (index / fps) seconds.
"""

from __future__ import annotations

from typing import Any

from epd.server.models import qwen_video
from epd.server.models.qwen2_vl import _QwenVl
from epd.server.models.video import VideoClip


class Qwen3Vl(_QwenVl):
    """Qwen3-VL (``Qwen3VLForConditionalGeneration``), dense."""

    name = "qwen3_vl"
    title = "Qwen3-VL"
    architectures = ("Qwen3VLForConditionalGeneration",)

    def _vision_tower_class(self) -> Any:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        return Qwen3VLVisionModel

    def _video_resized(
        self, num_frames: int, height: int, width: int, processor: Any
    ) -> tuple[int, int]:
        return qwen_video.whole_clip_resized(num_frames, height, width, processor)

    def _video_timing(
        self, clip: VideoClip, indices: tuple[int, ...], processor: Any
    ) -> dict[str, Any]:
        from transformers import Qwen3VLProcessor

        # NOTE: a function of its arguments alone, though written as a method.
        calculate: Any = Qwen3VLProcessor._calculate_timestamps
        seconds = calculate(None, list(indices), clip.fps, processor.temporal_patch_size)
        return {"timestamps": tuple(float(second) for second in seconds)}

    def video_prompt_tokens(
        self, grid: Any, timestamps: tuple[float, ...], config: Any, tokenizer: Any
    ) -> list[int] | None:
        # NOTE: as vLLM's Qwen3VLMultiModalProcessor.get_video_repl and transformers'
        # Qwen3VLProcessor.replace_video_token: each patch's "<t seconds>", tokenized alone,
        # then its rows between vision start and end.
        per_patch = int(grid[1]) * int(grid[2]) // self.merge_size(config) ** 2
        start, end = int(config.vision_start_token_id), int(config.vision_end_token_id)
        tokens: list[int] = []
        for second in timestamps:
            tokens += tokenizer.encode(f"<{second:.1f} seconds>", add_special_tokens=False)
            tokens += [start, *[int(config.video_token_id)] * per_patch, end]
        return tokens

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
