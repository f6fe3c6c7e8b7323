"""mm_hash: the identity of an image as far as embeddings are concerned.

A hash over the decoded pixels (so the same picture sent as PNG, as JPEG-decoded-identically, by
URL or by bytes hashes the same), their size and mode, plus everything else that changes the
embedding: the model id and a fingerprint of its image-processor settings. Stable across
processes and hosts (blake2b, no salt).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from PIL import Image

HASH_VERSION = b"epd-mm-v1"


def processor_fingerprint(model_dir: str | Path) -> str:
    """A short hash of the model's preprocessor settings (preprocessor_config.json)."""
    path = Path(model_dir) / "preprocessor_config.json"
    settings = json.loads(path.read_text()) if path.exists() else {}
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(canonical, digest_size=8).hexdigest()


def mm_hash(image: Image.Image, *, model_id: str, processor_fingerprint: str) -> str:
    """The content hash of ``image`` for ``model_id`` with that processor (hex, 32 chars)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (HASH_VERSION, model_id.encode(), processor_fingerprint.encode(),
                 image.mode.encode(), f"{image.width}x{image.height}".encode()):  # fmt: skip
        digest.update(len(part).to_bytes(4, "little") + part)
    digest.update(image.tobytes())
    return digest.hexdigest()
