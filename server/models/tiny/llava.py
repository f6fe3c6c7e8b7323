"""A tiny LLaVA-1.5 checkpoint: a CLIP tower on a 112-pixel square (patches of 14: 64 rows per
image; the hub's: 336 pixels, 576 rows) read at layer -2 without CLS, a Llama text model,
``<image>`` as a special token, the hub's chat template, and the hub's weight names:
transformers 5.19 saves the tower without ``vision_model.``, which vLLM 0.32's loader does not
find, so ``finish_checkpoint`` renames them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epd.server.models.tiny.builder import TinyBuilder, TinySizes, tiny_text_config
from epd.server.models.tiny.projected_tower import tiny_vision_config

PATCH_SIZE = 14
IMAGE_TOKEN = "<image>"
# NOTE: a tiny tower sees 112 x 112 pixels (64 rows per image); the hub's sees 336 x 336 (576).
TINY_IMAGE_SIZE = 112

# NOTE: the hub's llava-1.5 template: per message, its images first, then its text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


class LlavaBuilder(TinyBuilder):
    """Tiny LLaVA-1.5 (``LlavaForConditionalGeneration`` with a CLIP tower)."""

    name = "llava"
    chat_template = CHAT_TEMPLATE
    special_tokens = (IMAGE_TOKEN,)

    def save_processor(self, tokenizer: Any, sizes: TinySizes, out: Path) -> None:
        from transformers import CLIPImageProcessor, LlavaProcessor

        image_processor = CLIPImageProcessor(
            size={"shortest_edge": TINY_IMAGE_SIZE},
            crop_size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
        )
        processor = LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=PATCH_SIZE,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=self.chat_template,
        )
        processor.save_pretrained(out)
        image_processor.save_pretrained(out)

    def model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        import torch
        from transformers import LlavaConfig, LlavaForConditionalGeneration

        config = LlavaConfig(
            text_config=_text_config(token_ids, vocab_size, sizes),
            vision_config=tiny_vision_config(
                sizes,
                TINY_IMAGE_SIZE,
                PATCH_SIZE,
                model_type="clip_vision_model",
                projection_dim=sizes.vision_embed_dim,
            ),
            image_token_index=token_ids[IMAGE_TOKEN],
            image_seq_length=(TINY_IMAGE_SIZE // PATCH_SIZE) ** 2,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
            tie_word_embeddings=False,
        )
        return LlavaForConditionalGeneration(config).eval().to(torch.float32)

    def finish_checkpoint(self, out: Path) -> None:
        name_tower_as_hub(out)


def name_tower_as_hub(out: Path) -> None:
    """Name the tower's weights of the checkpoint in ``out`` as the hub does
    (``vision_tower.vision_model.*``; transformers 5.19 saves CLIP and SigLIP towers without
    ``vision_model.``)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = out / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        state = {_hub_name(key): f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    save_file(state, str(path), metadata=metadata)


def _hub_name(key: str) -> str:
    if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + key.removeprefix("vision_tower.")
    return key


def _text_config(token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
    # NOTE: the hub's Vicuna takes theta 10000; at tiny sizes its greedy margins are narrow
    # (0.006 on the tiny-model test's prompt), Qwen's 1e6 gives 0.27.
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    return {"model_type": "llama", **tiny_text_config(token_ids, vocab_size, sizes, rope)}
