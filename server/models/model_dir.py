"""The model directory every service is started with."""

from __future__ import annotations

from pathlib import Path

from epd.server.models.registry import family_of


def require_model_dir(path: Path) -> Path:
    """``path`` if it holds a checkpoint of a supported family, else ValueError saying what is
    wrong (no ``config.json``; an architecture no family serves, naming the supported ones)."""
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model directory (no config.json)")
    family_of(path)
    return path
