"""mm_hash: the identity of an image as far as embeddings are concerned.

A hash over the decoded RGB pixels (so the same picture sent as PNG, as JPEG-decoded-identically,
by URL or by bytes hashes the same), their size and mode, plus everything else that changes the
embedding: the model id and a fingerprint of its image-processor settings. Stable across
processes and hosts (blake2b, no salt).

Tenants: the route moves a request's mm_hashes into its tenant's key namespace (``key_salt`` of
the caller's token identity and cache_salt, then ``salted``) before any hop sees them, so every
cache keyed by mm_hash (encoders', the embedding store, vLLM's multimodal and prefix caches, the
scheduler's prefix index) keeps tenants apart; without a token or cache_salt the keys are the
plain mm_hashes, one shared namespace.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from blake3 import blake3

HASH_VERSION = b"epd-mm-v1"
RGB = "RGB"
MM_HASH_CHARS = 32
HEX_DIGITS = frozenset("0123456789abcdef")
KEY_SALT_VERSION = b"epd-tenant-v1"
IMAGE_SETTINGS_VERSION = b"epd-image-settings-v1"


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def processor_fingerprint(model_dir: str | Path) -> str:
    """A short hash of the model's processor settings: ``preprocessor_config.json`` (the image
    processor, as checkpoints saved before transformers 5 keep it) and ``processor_config.json``
    (the processor's own settings, and the image processor nested in it, which transformers 5
    reads first), whichever exist."""
    settings: dict[str, object] = {}
    for name in PROCESSOR_FILES:
        path = Path(model_dir) / name
        if path.exists():
            settings[name] = json.loads(path.read_text())
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(canonical, digest_size=8).hexdigest()


def mm_hash(pixels: np.ndarray, *, model_id: str, processor_fingerprint: str) -> str:
    """The content hash of an RGB image's ``pixels`` (uint8 [height, width, 3], C-contiguous:
    the bytes Pillow's ``tobytes`` gives) for ``model_id`` with that processor (hex, 32 chars).
    Walks every pixel once, without a copy."""
    height, width = pixels.shape[:2]
    digest = hashlib.blake2b(digest_size=16)
    for part in (
        HASH_VERSION,
        model_id.encode(),
        processor_fingerprint.encode(),
        RGB.encode(),
        f"{width}x{height}".encode(),
    ):
        digest.update(len(part).to_bytes(4, "little") + part)
    digest.update(np.ascontiguousarray(pixels).data)
    return digest.hexdigest()


def source_key(source: bytes) -> str:
    """The key of an item's source bytes in this process's caches of loaded media (32 hex
    digits): blake3, vLLM's hash of multimodal items, several times faster than blake2b over
    an image's bytes. Never leaves the process (an mm_hash is the key other processes see)."""
    return blake3(source).hexdigest(length=16)


def under_settings(mm_hash_hex: str, settings_key: str) -> str:
    """The identity of the image ``mm_hash_hex`` resized under the processor settings
    ``settings_key`` (``image_settings.ImageSettings.key``): itself for "" (the model's own
    settings, already in the content hash's processor fingerprint), else an mm_hash of both
    that no other settings give, as vLLM hashes an item with its ``hf_processor_mm_kwargs``."""
    if not settings_key:
        return mm_hash_hex
    digest = hashlib.blake2b(IMAGE_SETTINGS_VERSION, digest_size=16)
    for part in (settings_key.encode(), mm_hash_hex.encode()):
        digest.update(len(part).to_bytes(4, "little") + part)
    return digest.hexdigest()


def is_mm_hash(text: str) -> bool:
    """Whether ``text`` has the form of an mm_hash (32 lower-case hex digits)."""
    return len(text) == MM_HASH_CHARS and all(c in HEX_DIGITS for c in text)


def pixels_tag(mm_hash_hex: str) -> bytes:
    """The content tag (``transfer.payload_layout``) of an image's shared pixels: its mm_hash;
    ValueError for a text that is no mm_hash (``is_mm_hash``)."""
    if not is_mm_hash(mm_hash_hex):
        raise ValueError(f"{mm_hash_hex!r} is not an mm_hash")
    return bytes.fromhex(mm_hash_hex)


def embeddings_tag(mm_hash_hex: str) -> bytes:
    """The content tag of the embeddings an encoder made of the image ``mm_hash_hex``: apart
    from the pixels' tag, so neither payload can pass for the other."""
    return hashlib.blake2b(b"epd-embeddings:" + mm_hash_hex.encode(), digest_size=16).digest()


def key_salt(tenant: str, cache_salt: str) -> str:
    """The salt of a request's cache keys: a hash of its caller's ``tenant`` (a token identity,
    ``common.auth.token_identity``; "" without auth) and its ``cache_salt`` ("" when not given),
    32 hex digits, which vLLM takes as a cache_salt; "" when both are empty (the shared
    namespace)."""
    if not tenant and not cache_salt:
        return ""
    digest = hashlib.blake2b(KEY_SALT_VERSION, digest_size=16)
    for part in (tenant.encode(), cache_salt.encode()):
        digest.update(len(part).to_bytes(4, "little") + part)
    return digest.hexdigest()


def salted(mm_hash_hex: str, salt: str) -> str:
    """``mm_hash_hex`` in the key namespace of ``salt`` (``key_salt``): itself for "", else an
    mm_hash of both (32 hex digits) that no other salt gives."""
    if not salt:
        return mm_hash_hex
    return hashlib.blake2b(f"{salt}:{mm_hash_hex}".encode(), digest_size=16).hexdigest()
