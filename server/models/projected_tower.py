"""What the families of a ViT-style tower and a ``multi_modal_projector`` share (LLaVA-1.5,
LLaVA-OneVision, InternVL): the module their vision weights load into, and the tower's config
of a tiny checkpoint."""

from __future__ import annotations

from typing import Any

from epd.server.models.family import TinySizes


def projected_tower(config: Any, vision_tower: Any, projector: Any) -> Any:
    """A module of ``vision_tower`` and ``projector`` under the names the checkpoints give their
    weights (``vision_tower.*``, ``multi_modal_projector.*``), holding the model's ``config``."""
    from torch import nn

    tower = nn.ModuleDict({"vision_tower": vision_tower, "multi_modal_projector": projector})
    tower.config = config
    return tower


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
