"""Which family serves a checkpoint directory, from its ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from epd.server.models.family import ModelFamily
from epd.server.models.internvl import InternVl
from epd.server.models.llava import Llava
from epd.server.models.llava_onevision import LlavaOnevision
from epd.server.models.qwen2_vl import Qwen2_5Vl, Qwen2Vl
from epd.server.models.qwen3_vl import Qwen3Vl

FAMILIES: tuple[ModelFamily, ...] = (
    Qwen2Vl(),
    Qwen2_5Vl(),
    Qwen3Vl(),
    Llava(),
    LlavaOnevision(),
    InternVl(),
)


class UnsupportedModel(ValueError):
    """The checkpoint's architecture is not one a family serves (the message names both)."""


def supported() -> str:
    """The supported families, for messages: ``Qwen2-VL (qwen2_vl), ...``."""
    return ", ".join(f"{family.title} ({family.name})" for family in FAMILIES)


def family_named(name: str) -> ModelFamily:
    """The family called ``name`` (``qwen2_vl``, ...); UnsupportedModel if none is."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise UnsupportedModel(f"unknown model family {name!r}; supported: {supported()}")


def family_of(model_dir: str | Path) -> ModelFamily:
    """The family of the checkpoint in ``model_dir``; UnsupportedModel (a ValueError) naming
    the architecture and the supported families if none serves it, ValueError if the
    directory holds no readable ``config.json``."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{model_dir} is not a model directory ({path.name}: {e})") from e
    if not isinstance(config, dict):
        config = {}
    return _family_serving(config.get("architectures"), config.get("model_type"), model_dir)


def family_of_config(config: Any) -> ModelFamily:
    """The family of a loaded transformers ``config`` (its ``architectures``); UnsupportedModel
    as ``family_of``."""
    architectures = getattr(config, "architectures", None)
    return _family_serving(architectures, getattr(config, "model_type", None), "the model")


def _family_serving(architectures: Any, model_type: Any, where: object) -> ModelFamily:
    names = [a for a in architectures or () if isinstance(a, str)]
    for family in FAMILIES:
        if any(name in family.architectures for name in names):
            return family
    shown = ", ".join(names) or f"none (model_type {model_type!r})"
    raise UnsupportedModel(
        f"{where}: architecture {shown} is not supported; supported families: {supported()}"
    )
