"""What the families of a ViT-style tower and a ``multi_modal_projector`` share (LLaVA-1.5,
LLaVA-OneVision, InternVL): the module their vision weights load into."""

from __future__ import annotations

from typing import Any


def projected_tower(config: Any, vision_tower: Any, projector: Any) -> Any:
    """A module of ``vision_tower`` and ``projector`` under the names the checkpoints give their
    weights (``vision_tower.*``, ``multi_modal_projector.*``), holding the model's ``config``."""
    from torch import nn

    tower = nn.ModuleDict({"vision_tower": vision_tower, "multi_modal_projector": projector})
    tower.config = config
    return tower
