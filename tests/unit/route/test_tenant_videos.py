"""A tenant's video reaches the prefill worker named by its salted hash (vLLM's caches key by
that name), as its chunks are; without a salt the name is the plain video hash."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from epd.server.media.hashing import key_salt, salted
from epd.server.route.media import RouteVideo, video_input
from epd.v1 import multimodal_pb2

VIDEO_HASH, CHUNK_HASH = "a" * 32, "c" * 32


def named(salt: str) -> str:
    plan = SimpleNamespace(grid=(2, 4, 4), seconds_per_temporal_patch=1.0, timestamps=None)
    planned: Any = SimpleNamespace(video_hash=VIDEO_HASH, plan=plan)
    chunk = multimodal_pb2.MediaItem(mm_hash=salted(CHUNK_HASH, salt), key_salt=salt)
    return video_input(RouteVideo(planned, [], [chunk], tokens=8), []).mm_hash


def test_a_tenant_s_video_is_named_by_its_salted_hash() -> None:
    salt = key_salt("tenant", "")
    assert named(salt) == salted(VIDEO_HASH, salt) != VIDEO_HASH
    assert named("") == VIDEO_HASH
