"""A video's identity, and the content hashes of its chunks.

A video's hash covers its kept frames (decoded RGB, at their decoded size), its plan (sampling
settings, frames kept, size, grid, and the timing the prompt shows) and everything else that
changes its embeddings: the model id and the fingerprint of the processor settings, the video
processor's included. The same clip sent as mp4 or webm hashes the same when it decodes to the
same pixels.

A chunk is a run of temporal patches, cut at patch boundaries, so only the last chunk of a clip
of an odd frame count holds an odd count (its processor repeats the last frame). Its embeddings
depend on its frames and the size they are resized to, not on where it sits in the clip, so its
hash covers those alone: a repeated or overlapping clip shares the chunks it has in common.
Hashes are blake2b (no salt) hex, 32 characters, like an image's ``mm_hash``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from epd.server.media.hashing import processor_fingerprint
from epd.server.models.video import VideoPlan

VIDEO_HASH_VERSION = b"epd-video-v1"
CHUNK_HASH_VERSION = b"epd-video-chunk-v1"
#: where transformers also looks for a video processor's settings
VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"


@dataclass(frozen=True, slots=True)
class VideoChunk:
    """``num_patches`` temporal patches: the kept frames ``frames`` (a range of positions
    among them) and their content hash."""

    num_patches: int
    frames: range
    content_hash: str


def video_processor_fingerprint(model_dir: str | Path) -> str:
    """``processor_fingerprint`` of the model with ``video_preprocessor_config.json``, where
    the video processor's settings may lie alone."""
    path = Path(model_dir) / VIDEO_PROCESSOR_FILE
    video = json.loads(path.read_text()) if path.exists() else None
    canonical = json.dumps([processor_fingerprint(model_dir), video], sort_keys=True)
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def video_hash(frames: np.ndarray, plan: VideoPlan, *, model_id: str, fingerprint: str) -> str:
    """The identity of a video whose kept ``frames`` (uint8 [n, height, width, 3]) ``plan``
    describes, for ``model_id`` with the processor of ``fingerprint`` (hex, 32 chars)."""
    settings = json.dumps(asdict(plan), sort_keys=True)
    return _digest(VIDEO_HASH_VERSION, (model_id, fingerprint, settings), frames)


def chunk_ranges(num_frames: int, temporal_patch_size: int, patches_per_chunk: int) -> list[range]:
    """Positions of ``num_frames`` kept frames cut into runs of ``patches_per_chunk`` temporal
    patches of ``temporal_patch_size`` frames (the last run shorter where they run out)."""
    if min(num_frames, temporal_patch_size, patches_per_chunk) <= 0:
        raise ValueError("frames, temporal patch size and patches per chunk must be positive")
    step = temporal_patch_size * patches_per_chunk
    return [range(start, min(start + step, num_frames)) for start in range(0, num_frames, step)]


def chunk_hashes(
    frames: np.ndarray,
    plan: VideoPlan,
    patches_per_chunk: int,
    *,
    model_id: str,
    fingerprint: str,
) -> list[VideoChunk]:
    """The chunks of ``patches_per_chunk`` temporal patches of a video's kept ``frames`` (as
    ``video_hash``), in order, each with its content hash."""
    temporal = plan.temporal_patch_size
    return [
        VideoChunk(
            num_patches=-(-len(positions) // temporal),
            frames=positions,
            content_hash=chunk_hash(
                frames[positions.start : positions.stop],
                plan.resized,
                temporal,
                model_id=model_id,
                fingerprint=fingerprint,
            ),
        )
        for positions in chunk_ranges(len(frames), temporal, patches_per_chunk)
    ]


def chunk_hash(
    frames: np.ndarray,
    resized: tuple[int, int],
    temporal_patch_size: int,
    *,
    model_id: str,
    fingerprint: str,
) -> str:
    """The content hash of a chunk's kept ``frames`` (uint8 [n, height, width, 3]) resized to
    ``resized`` (height, width) in temporal patches of ``temporal_patch_size`` frames."""
    settings = json.dumps({"resized": list(resized), "temporal_patch_size": temporal_patch_size})
    return _digest(CHUNK_HASH_VERSION, (model_id, fingerprint, settings), frames)


def _digest(version: bytes, texts: tuple[str, ...], frames: np.ndarray) -> str:
    digest = hashlib.blake2b(digest_size=16)
    shape = "x".join(str(size) for size in frames.shape)
    for part in (version, *(text.encode() for text in texts), shape.encode()):
        digest.update(len(part).to_bytes(4, "little") + part)
    digest.update(np.ascontiguousarray(frames, dtype=np.uint8).data)
    return digest.hexdigest()
