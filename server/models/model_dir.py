"""The model directory every service is started with: a local directory, or a Hugging Face hub
id resolved into the hub's cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
)

# NOTE: public, but mypy cannot read the lazy __all__ that exports it
from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

from epd.server.models.registry import family_of

DEFAULT_REVISION = "main"
# NOTE: other formats of the same weights, which no engine here loads
IGNORED_FILES = ["*.gguf", "*.onnx", "onnx/*", "*.msgpack", "*.h5", "original/*"]


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model a service can load: its checkpoint ``path`` and the name clients use for it by
    default (``model_id``: the hub id, or the directory's name)."""

    path: Path
    model_id: str


def require_model_dir(path: Path) -> Path:
    """``path`` if it holds a checkpoint of a supported family, else ValueError saying what is
    wrong (no ``config.json``; an architecture no family serves, naming the supported ones)."""
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model directory (no config.json)")
    family_of(path)
    return path


def context_length(config: Any) -> int | None:
    """A model's own context in tokens as its transformers ``config`` states it (the
    ``max_position_embeddings`` of its text config; None when it states none): the route bounds
    prompts by it and ``--max-model-len`` defaults to it."""
    value = getattr(config.get_text_config(), "max_position_embeddings", None)
    return int(value) if value else None


def max_model_len(given: int | None, config: Any) -> int:
    """``given`` (``--max-model-len``), else the model's own context (``context_length``);
    ValueError when neither says."""
    if given is not None:
        return given
    context = context_length(config)
    if context is None:
        raise ValueError("the model's config states no context length: give --max-model-len")
    return context


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the form of a hub model id, ``ORG/NAME``."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return name.count("/") == 1


def resolve_model(
    name: str, revision: str | None = None, *, cache_dir: Path | None = None
) -> ResolvedModel:
    """The model ``--model name`` names: an existing directory as it is, else a hub id's snapshot
    at ``revision`` (default main) in the hub cache (``cache_dir``, default the hub's:
    ``HF_HUB_CACHE``). The cache is read first without the network; only a model it lacks is
    downloaded, unless ``HF_HUB_OFFLINE`` is set. ValueError naming the model (and revision) when
    it is neither, cannot be found or fetched, or is no checkpoint of a supported family."""
    path = Path(name)
    if path.is_dir():
        if revision is not None:
            raise ValueError(f"--revision {revision} is for hub ids; {name} is a directory")
        return ResolvedModel(require_model_dir(path), Path(os.path.abspath(path)).name)
    if not is_hub_id(name):
        raise ValueError(f"--model {name}: no such directory, nor a hub id of the form ORG/NAME")
    snapshot = _snapshot(name, revision or DEFAULT_REVISION, cache_dir)
    return ResolvedModel(require_model_dir(snapshot), name)


def _snapshot(repo_id: str, revision: str, cache_dir: Path | None) -> Path:
    def download(local_files_only: bool) -> Path:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            ignore_patterns=IGNORED_FILES,
        )
        return Path(folder)

    try:
        try:
            return download(local_files_only=True)
        except LocalEntryNotFoundError:
            return download(local_files_only=False)
    except (LocalEntryNotFoundError, HfHubHTTPError, HFValidationError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"--model {repo_id} (revision {revision}): no such directory, and the hub model is "
            f"neither in the hub cache nor downloadable: {reason}"
        ) from e
