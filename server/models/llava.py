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
loader and transformers 5 read; transformers 5.19 saves the tower without ``vision_model.``, so
the tiny builder renames its weights to the hub's names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epd.server.models.family import (
    Grid,
    ModelFamily,
    TinySizes,
    device_argument,
    image_size,
    tiny_text_config,
)
from epd.server.models.projected_tower import projected_tower, tiny_vision_config

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
    chat_template = CHAT_TEMPLATE
    tiny_special_tokens = (IMAGE_TOKEN,)

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

        inputs = processor(images=images, return_tensors="pt", **device_argument(device))
        grids = [self.image_grid(*image_size(image), config, processor) for image in images]
        return inputs["pixel_values"], torch.tensor(grids)

    def vllm_data(self, embeddings: list[Any], grids: list[Grid]) -> Any:
        import torch

        # NOTE: vLLM's LLaVA parser takes embeddings as the image data itself, [images, rows,
        # hidden]; a dict ({"image_embeds": ...}) is taken for an image source and refused.
        return torch.stack(embeddings)

    def save_tiny_processor(
        self, tokenizer: Any, sizes: TinySizes, chat_template: str, out: Path
    ) -> None:
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
            chat_template=chat_template,
        )
        processor.save_pretrained(out)
        image_processor.save_pretrained(out)

    def tiny_model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        import torch
        from transformers import LlavaConfig, LlavaForConditionalGeneration

        config = LlavaConfig(
            text_config=_tiny_text_config(token_ids, vocab_size, sizes),
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

    def finish_tiny_checkpoint(self, out: Path) -> None:
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


def _tiny_text_config(token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
    # NOTE: the hub's Vicuna takes theta 10000; at tiny sizes its greedy margins are narrow
    # (0.006 on the tiny-model test's prompt), Qwen's 1e6 gives 0.27.
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    return {"model_type": "llama", **tiny_text_config(token_ids, vocab_size, sizes, rope)}
