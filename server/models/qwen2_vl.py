"""Qwen2-VL and Qwen2.5-VL: one placeholder group per image
(``<|vision_start|><|image_pad|><|vision_end|>``, expanded to the image's merged patches),
transformers' ``smart_resize`` rule (sides multiples of patch x merge, pixels within the
processor's bounds), M-RoPE positions from the image grid, and embeddings that enter vLLM as
``image_embeds`` + ``image_grid_thw``. The two differ in the vision tower (Qwen2.5-VL: window
attention, RMSNorm, gated MLP) and its config's field names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epd.server.models.family import Grid, ModelFamily, TinySizes, tiny_text_config

# NOTE: Qwen2-VL's and Qwen2.5-VL's templates open with a default system turn; Qwen3-VL's do not.
DEFAULT_SYSTEM_TURN = (
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
)


def qwen_chat_template(system_turn: str) -> str:
    """The Qwen chat template (one placeholder group per image), opening each chat with
    ``system_turn`` (empty: none)."""
    return (
        "{% set image_count = namespace(value=0) %}"
        "{% for message in messages %}" + system_turn + "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
        "{% else %}{% for content in message['content'] %}"
        "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
        "{% set image_count.value = image_count.value + 1 %}"
        "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
        "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2


class _QwenVl(ModelFamily):
    """What Qwen2-VL and Qwen2.5-VL share."""

    visual_prefixes = ("model.visual.", "visual.")
    chat_template = qwen_chat_template(DEFAULT_SYSTEM_TURN)
    packs_images = True
    # NOTE: smart_resize's own bound: it refuses a longer side over 200x the shorter.
    max_aspect_ratio = 200

    def vision_tower(self, config: Any) -> Any:
        return self._vision_tower_class()._from_config(config.vision_config)

    def placeholder_start_id(self, config: Any) -> int | None:
        return int(config.vision_start_token_id)

    def merge_size(self, config: Any) -> int:
        return int(config.vision_config.spatial_merge_size)

    def image_grid(self, width: int, height: int, config: Any, processor: Any) -> Grid:
        # NOTE: transformers 5 keeps min/max pixels in size (shortest_edge / longest_edge); it
        # moves legacy min_pixels / max_pixels keys of preprocessor_config.json there on load.
        patch_size = int(processor.patch_size)
        resized_height, resized_width = self.resized(
            width,
            height,
            patch_size * int(processor.merge_size),
            int(processor.size["shortest_edge"]),
            int(processor.size["longest_edge"]),
        )
        return 1, resized_height // patch_size, resized_width // patch_size

    def positions(self, model: Any, ids: Any, is_image: Any, grids: Any) -> tuple[Any, int]:
        import torch

        if not bool(is_image.any()):
            return torch.arange(ids.shape[1], device=ids.device).expand(3, 1, -1), 0
        positions, deltas = model.model.get_rope_index(
            ids, mm_token_type_ids=is_image.int(), image_grid_thw=grids
        )
        return positions, int(deltas.flatten()[0])

    def decode_positions(self, position: int, device: Any) -> Any:
        import torch

        return torch.full((3, 1, 1), position, device=device)

    def vllm_data(self, embeddings: list[Any], grids: list[Grid]) -> Any:
        import torch

        return {"image_embeds": torch.cat(embeddings), "image_grid_thw": torch.tensor(grids)}

    def resized(
        self, width: int, height: int, factor: int, min_pixels: int, max_pixels: int
    ) -> tuple[int, int]:
        """(height, width) ``smart_resize`` makes of a ``width`` x ``height`` image."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        height, width = smart_resize(
            height, width, factor, min_pixels=min_pixels, max_pixels=max_pixels
        )
        return int(height), int(width)

    def save_tiny_processor(
        self, tokenizer: Any, sizes: TinySizes, chat_template: str, out: Path
    ) -> None:
        image_processor, video_processor = self._tiny_processors(sizes)
        processor = self._processor_class()(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=video_processor,
            chat_template=chat_template,
        )
        processor.save_pretrained(out)
        image_processor.save_pretrained(out)

    def _tiny_processors(self, sizes: TinySizes) -> tuple[Any, Any]:
        from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

        settings = dict(
            min_pixels=sizes.min_pixels,
            max_pixels=sizes.max_pixels,
            patch_size=PATCH_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            merge_size=MERGE_SIZE,
        )
        return Qwen2VLImageProcessor(**settings), Qwen2VLVideoProcessor(**settings)

    def tiny_model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        import torch

        config = self._config_class()(
            text_config=self._tiny_text_config(token_ids, vocab_size, sizes),
            vision_config=self._tiny_vision_config(sizes),
            image_token_id=token_ids["<|image_pad|>"],
            video_token_id=token_ids["<|video_pad|>"],
            vision_start_token_id=token_ids["<|vision_start|>"],
            vision_end_token_id=token_ids["<|vision_end|>"],
            tie_word_embeddings=False,
            bos_token_id=token_ids["<|endoftext|>"],
            eos_token_id=token_ids["<|im_end|>"],
        )
        return self._model_class()(config).eval().to(torch.float32)

    def _tiny_text_config(
        self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes
    ) -> dict[str, Any]:
        head_dim = sizes.hidden_size // sizes.num_heads
        rope = {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": mrope_section(head_dim),
        }
        return tiny_text_config(token_ids, vocab_size, sizes, rope)

    def _vision_tower_class(self) -> Any:
        raise NotImplementedError

    def _processor_class(self) -> Any:
        raise NotImplementedError

    def _config_class(self) -> Any:
        raise NotImplementedError

    def _model_class(self) -> Any:
        raise NotImplementedError

    def _tiny_vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        raise NotImplementedError


class Qwen2Vl(_QwenVl):
    """Qwen2-VL (``Qwen2VLForConditionalGeneration``)."""

    name = "qwen2_vl"
    title = "Qwen2-VL"
    architectures = ("Qwen2VLForConditionalGeneration",)

    def _vision_tower_class(self) -> Any:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )

        return Qwen2VisionTransformerPretrainedModel

    def _processor_class(self) -> Any:
        from transformers import Qwen2VLProcessor

        return Qwen2VLProcessor

    def _config_class(self) -> Any:
        from transformers import Qwen2VLConfig

        return Qwen2VLConfig

    def _model_class(self) -> Any:
        from transformers import Qwen2VLForConditionalGeneration

        return Qwen2VLForConditionalGeneration

    def _tiny_vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        return dict(
            depth=sizes.vision_depth,
            embed_dim=sizes.vision_embed_dim,
            hidden_size=sizes.hidden_size,
            num_heads=sizes.vision_num_heads,
            mlp_ratio=2,
            patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            in_channels=3,
            initializer_range=sizes.init_range,
        )


class Qwen2_5Vl(_QwenVl):  # noqa: N801 - the model's own name
    """Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``)."""

    name = "qwen2_5_vl"
    title = "Qwen2.5-VL"
    architectures = ("Qwen2_5_VLForConditionalGeneration",)

    def _vision_tower_class(self) -> Any:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        return Qwen2_5_VisionTransformerPretrainedModel

    def _processor_class(self) -> Any:
        from transformers import Qwen2_5_VLProcessor

        return Qwen2_5_VLProcessor

    def _config_class(self) -> Any:
        from transformers import Qwen2_5_VLConfig

        return Qwen2_5_VLConfig

    def _model_class(self) -> Any:
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration

    def _tiny_vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        # NOTE: the last block attends over the whole image, the others within windows of
        # window_size pixels, as in the hub's checkpoints (every 8th block there).
        return dict(
            depth=sizes.vision_depth,
            hidden_size=sizes.vision_embed_dim,
            intermediate_size=2 * sizes.vision_embed_dim,
            out_hidden_size=sizes.hidden_size,
            num_heads=sizes.vision_num_heads,
            patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            window_size=112,
            fullatt_block_indexes=[sizes.vision_depth - 1],
            tokens_per_second=2,
            in_channels=3,
            initializer_range=sizes.init_range,
        )


def mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen2-VL (16:24:24)."""
    half = head_dim // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    return [temporal, spatial, half - temporal - spatial]
