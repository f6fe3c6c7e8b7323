"""A tiny InternVL checkpoint (the hub's ``-hf`` layout): an InternViT on 112-pixel tiles
(patches of 14, pixel-shuffled 2 x 2: 16 rows a tile), at most 4 tiles plus the thumbnail, a
Qwen2 text model, the hub's added tokens (``<img>``, ``</img>``, ``<IMG_CONTEXT>``, ``<video>``
named on the tokenizer as its processor reads them), ImageNet mean and std, and the hub's chat
template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epd.server.models.internvl import CONTEXT_TOKEN, END_TOKEN, START_TOKEN
from epd.server.models.tiny.builder import TinyBuilder, TinySizes, tiny_text_config
from epd.server.models.tiny.projected_tower import tiny_vision_config

PATCH_SIZE = 14
VIDEO_TOKEN = "<video>"
HUB_EXTRA_TOKENS = ("<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>")
# NOTE: a tiny tile is 112 pixels (16 rows) and an image takes at most 4 tiles + the thumbnail;
# the hub's tile is 448 pixels (256 rows), at most 12 tiles.
TINY_TILE_SIZE = 112
TINY_MAX_TILES = 4
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# NOTE: the hub's InternVL -hf template: per message, its parts in order; an image is one
# <IMG_CONTEXT> and a newline.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)


class InternVlBuilder(TinyBuilder):
    """Tiny InternVL, transformers format (``InternVLForConditionalGeneration``)."""

    name = "internvl"
    chat_template = CHAT_TEMPLATE
    # NOTE: the hub's added tokens; vLLM's prompt update needs <video> to be one token too.
    special_tokens = (START_TOKEN, END_TOKEN, CONTEXT_TOKEN, VIDEO_TOKEN, *HUB_EXTRA_TOKENS)
    named_tokens = (
        ("start_image_token", START_TOKEN),
        ("end_image_token", END_TOKEN),
        ("context_image_token", CONTEXT_TOKEN),
        ("video_token", VIDEO_TOKEN),
    )

    def save_processor(self, tokenizer: Any, sizes: TinySizes, out: Path) -> None:
        from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

        size = {"height": TINY_TILE_SIZE, "width": TINY_TILE_SIZE}
        normalise = dict(image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD))
        image_processor = GotOcr2ImageProcessor(
            size=size, min_patches=1, max_patches=TINY_MAX_TILES, **normalise
        )
        processor = InternVLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=InternVLVideoProcessor(size=size, **normalise),
            image_seq_length=_rows_per_tile(),
            chat_template=self.chat_template,
        )
        processor.save_pretrained(out)
        image_processor.save_pretrained(out)

    def model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        import torch
        from transformers import InternVLConfig, InternVLForConditionalGeneration

        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        text_config = {
            "model_type": "qwen2",
            **tiny_text_config(token_ids, vocab_size, sizes, rope),
        }
        config = InternVLConfig(
            text_config=text_config,
            vision_config=tiny_vision_config(sizes, TINY_TILE_SIZE, PATCH_SIZE),
            image_token_id=token_ids[CONTEXT_TOKEN],
            image_seq_length=_rows_per_tile(),
            downsample_ratio=0.5,
            tie_word_embeddings=False,
        )
        return InternVLForConditionalGeneration(config).eval().to(torch.float32)


def _rows_per_tile() -> int:
    return (TINY_TILE_SIZE // PATCH_SIZE) ** 2 // 4
