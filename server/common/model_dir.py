"""The model directory every service is started with."""

from __future__ import annotations

from pathlib import Path


def require_model_dir(path: Path) -> Path:
    """``path`` if it holds a model (a ``config.json``), else ValueError saying what is wrong."""
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model directory (no config.json)")
    return path
