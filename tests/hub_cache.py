"""A Hugging Face hub cache holding local checkpoints under hub ids, laid out as
``huggingface_hub`` lays out what it downloads, so a model given by hub id resolves offline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from huggingface_hub.file_download import repo_folder_name


def place_in_hub_cache(
    model_dir: Path, cache: Path, repo_id: str, *, commit: str, revision: str = "main"
) -> Path:
    """Store ``model_dir``'s files in ``cache`` as ``repo_id`` at ``commit`` (40 hex digits):
    each file a blob named by its sha256, linked from ``snapshots/<commit>/``, and
    ``refs/<revision>`` naming the commit. Returns the snapshot folder."""
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = storage / "snapshots" / commit
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    return snapshot
