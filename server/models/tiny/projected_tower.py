"""The tower's config of a tiny checkpoint of the families of a ViT-style tower and a
``multi_modal_projector`` (LLaVA-1.5, LLaVA-OneVision, InternVL)."""

from __future__ import annotations

from typing import Any

from epd.server.models.tiny.builder import TinySizes


def tiny_vision_config(
    sizes: TinySizes, image_size: int, patch_size: int, **settings: Any
) -> dict[str, Any]:
    """The tower's config of a tiny checkpoint: ``sizes``' vision width, depth and heads, an MLP
    twice the width, the tower's ``image_size`` and ``patch_size``, and its own ``settings``
    (model type and the like)."""
    return dict(
        hidden_size=sizes.vision_embed_dim,
        intermediate_size=2 * sizes.vision_embed_dim,
        num_hidden_layers=sizes.vision_depth,
        num_attention_heads=sizes.vision_num_heads,
        image_size=image_size,
        patch_size=patch_size,
        initializer_range=sizes.init_range,
        **settings,
    )
