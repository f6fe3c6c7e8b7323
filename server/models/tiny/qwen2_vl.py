"""Tiny Qwen2-VL and Qwen2.5-VL checkpoints: the hub's chat template (one placeholder group per
image and per video, a default system turn), patches of 14 merged 2 x 2, M-RoPE sections as the
hub's, each tower's own config fields (Qwen2.5-VL: windowed blocks, the last attending the whole
image), and a video processor that samples 2 frames a second, saved as
``video_preprocessor_config.json`` too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epd.server.models.tiny.builder import TinyBuilder, TinySizes, tiny_text_config

# NOTE: Qwen2-VL's and Qwen2.5-VL's templates open with a default system turn; Qwen3-VL's do not.
DEFAULT_SYSTEM_TURN = (
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
)


def qwen_chat_template(system_turn: str) -> str:
    """The Qwen chat template (one placeholder group per image and per video), opening each
    chat with ``system_turn`` (empty: none)."""
    return (
        "{% set image_count = namespace(value=0) %}"
        "{% set video_count = namespace(value=0) %}"
        "{% for message in messages %}" + system_turn + "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
        "{% else %}{% for content in message['content'] %}"
        "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
        "{% set image_count.value = image_count.value + 1 %}"
        "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif content['type'] == 'video' or 'video' in content %}"
        "{% set video_count.value = video_count.value + 1 %}"
        "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
        "<|vision_start|><|video_pad|><|vision_end|>"
        "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
        "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
#: how the tiny video processors sample (the hub's Qwen3-VL settings; qwen-vl-utils' for all)
VIDEO_SAMPLING = dict(do_sample_frames=True, fps=2.0, min_frames=4, max_frames=768)


class QwenVlBuilder(TinyBuilder):
    """What the Qwen families' builders share: the config of ``config_class`` with the text
    and vision configs, the processor of ``processor_class`` with ``_processors``', the model
    of ``model_class`` (each the name of a transformers class, imported when building)."""

    chat_template = qwen_chat_template(DEFAULT_SYSTEM_TURN)
    processor_class: str
    config_class: str
    model_class: str

    def save_processor(self, tokenizer: Any, sizes: TinySizes, out: Path) -> None:
        image_processor, video_processor = self._processors(sizes)
        processor = self._transformers_class(self.processor_class)(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=video_processor,
            chat_template=self.chat_template,
        )
        processor.save_pretrained(out)
        image_processor.save_pretrained(out)
        video_processor.save_pretrained(out)

    def model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        import torch

        config = self._transformers_class(self.config_class)(
            text_config=self._text_config(token_ids, vocab_size, sizes),
            vision_config=self._vision_config(sizes),
            image_token_id=token_ids["<|image_pad|>"],
            video_token_id=token_ids["<|video_pad|>"],
            vision_start_token_id=token_ids["<|vision_start|>"],
            vision_end_token_id=token_ids["<|vision_end|>"],
            tie_word_embeddings=False,
            bos_token_id=token_ids["<|endoftext|>"],
            eos_token_id=token_ids["<|im_end|>"],
        )
        return self._transformers_class(self.model_class)(config).eval().to(torch.float32)

    def _processors(self, sizes: TinySizes) -> tuple[Any, Any]:
        from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

        settings = dict(
            min_pixels=sizes.min_pixels,
            max_pixels=sizes.max_pixels,
            patch_size=PATCH_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            merge_size=MERGE_SIZE,
        )
        return Qwen2VLImageProcessor(**settings), Qwen2VLVideoProcessor(
            **settings, **VIDEO_SAMPLING
        )

    def _text_config(
        self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes
    ) -> dict[str, Any]:
        head_dim = sizes.hidden_size // sizes.num_heads
        rope = {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": mrope_section(head_dim),
        }
        return tiny_text_config(token_ids, vocab_size, sizes, rope)

    def _transformers_class(self, name: str) -> Any:
        import transformers

        return getattr(transformers, name)

    def _vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        raise NotImplementedError


class Qwen2VlBuilder(QwenVlBuilder):
    """Tiny Qwen2-VL (``Qwen2VLForConditionalGeneration``)."""

    name = "qwen2_vl"
    processor_class = "Qwen2VLProcessor"
    config_class = "Qwen2VLConfig"
    model_class = "Qwen2VLForConditionalGeneration"

    def _vision_config(self, sizes: TinySizes) -> dict[str, Any]:
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


class Qwen2_5VlBuilder(QwenVlBuilder):  # noqa: N801 - the model's own name
    """Tiny Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``)."""

    name = "qwen2_5_vl"
    processor_class = "Qwen2_5_VLProcessor"
    config_class = "Qwen2_5_VLConfig"
    model_class = "Qwen2_5_VLForConditionalGeneration"

    def _vision_config(self, sizes: TinySizes) -> dict[str, Any]:
        # NOTE: the last block attends over the whole image, the others within windows of
        # window_size pixels, as in the hub's checkpoints (every 8th block there).
        return merged_tower_config(
            sizes,
            PATCH_SIZE,
            window_size=112,
            fullatt_block_indexes=[sizes.vision_depth - 1],
            tokens_per_second=2,
        )


def merged_tower_config(sizes: TinySizes, patch_size: int, **own: Any) -> dict[str, Any]:
    """The vision config of a tower that projects to the language model itself (Qwen2.5-VL's
    and Qwen3-VL's): ``sizes``' depth, width (an MLP twice as wide) and heads, the language
    model's width out, patches of ``patch_size`` merged as Qwen's, and the family's ``own``
    fields."""
    return dict(
        depth=sizes.vision_depth,
        hidden_size=sizes.vision_embed_dim,
        intermediate_size=2 * sizes.vision_embed_dim,
        out_hidden_size=sizes.hidden_size,
        num_heads=sizes.vision_num_heads,
        patch_size=patch_size,
        spatial_merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        in_channels=3,
        initializer_range=sizes.init_range,
        **own,
    )


def mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen2-VL (16:24:24)."""
    half = head_dim // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    return [temporal, spatial, half - temporal - spatial]
