"""A tiny LLaVA-OneVision checkpoint (the hub's llava-onevision-qwen2-0.5b-ov-hf layout): a SigLIP
tower on 56-pixel tiles (patches of 14: 16 rows a tile; the hub's: 384 pixels, 729 rows) read at
its last layer with every patch, pinpoints of 1 to 6 tiles a side as the hub's, 'anyres_max_9', a
Qwen2 text model, ``<image>`` and ``<video>`` as special tokens, the hub's chat template, and the
hub's weight names (the tower's renamed as for LLaVA-1.5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epd.server.models.tiny.builder import TinyBuilder, TinySizes, tiny_text_config
from epd.server.models.tiny.llava import name_tower_as_hub
from epd.server.models.tiny.projected_tower import tiny_vision_config

PATCH_SIZE = 14
IMAGE_TOKEN = "<image>"
VIDEO_TOKEN = "<video>"
# NOTE: a tiny tile is 56 pixels (16 rows), the hub's 384 (729); pinpoints are 1..6 tiles a side,
# as the hub's, so large images take the shrinking branch (over 9 tiles' rows).
TINY_TILE = 56
TINY_PINPOINTS = [[TINY_TILE * i, TINY_TILE * j] for i in range(1, 7) for j in range(1, 7)]
# NOTE: the hub's (transformers' conversion script's) template: per message, its images first.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class LlavaOnevisionBuilder(TinyBuilder):
    """Tiny LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``, SigLIP tower, anyres)."""

    name = "llava_onevision"
    chat_template = CHAT_TEMPLATE
    special_tokens = (IMAGE_TOKEN, VIDEO_TOKEN)

    def save_processor(self, tokenizer: Any, sizes: TinySizes, out: Path) -> None:
        from transformers import (
            LlavaOnevisionImageProcessor,
            LlavaOnevisionProcessor,
            LlavaOnevisionVideoProcessor,
        )

        image_processor = LlavaOnevisionImageProcessor(
            size={"height": TINY_TILE, "width": TINY_TILE},
            image_grid_pinpoints=TINY_PINPOINTS,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        )
        video_processor = LlavaOnevisionVideoProcessor(
            size={"height": TINY_TILE, "width": TINY_TILE},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        )
        processor = LlavaOnevisionProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=video_processor,
            num_image_tokens=(TINY_TILE // PATCH_SIZE) ** 2,
            vision_feature_select_strategy="full",
            vision_aspect_ratio="anyres_max_9",
            chat_template=self.chat_template,
        )
        processor.save_pretrained(out)
        image_processor.save_pretrained(out)

    def model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        import torch
        from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        config = LlavaOnevisionConfig(
            text_config={
                "model_type": "qwen2",
                **tiny_text_config(token_ids, vocab_size, sizes, rope),
            },
            vision_config=tiny_vision_config(
                sizes,
                TINY_TILE,
                PATCH_SIZE,
                model_type="siglip_vision_model",
                vision_use_head=False,
            ),
            image_token_index=token_ids[IMAGE_TOKEN],
            video_token_index=token_ids[VIDEO_TOKEN],
            image_grid_pinpoints=TINY_PINPOINTS,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
            vision_aspect_ratio="anyres_max_9",
            tie_word_embeddings=False,
        )
        return LlavaOnevisionForConditionalGeneration(config).eval().to(torch.float32)

    def finish_checkpoint(self, out: Path) -> None:
        name_tower_as_hub(out)
