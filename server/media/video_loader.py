"""Load one video (URL or bytes) into its planned, sampled frames, cached by source.

The bytes come as an image's do (``fetch_url``: http(s) under the same guard, ``data:`` and
``file:`` URLs) but under the video byte limit (``--media-max-video-mb``, refused as
``VIDEO_TOO_LARGE``); ``VideoPlanner.load`` then decodes them in a thread (decoding walks every
frame) and lets the model's video processor settings choose the frames. Identical sources load
once, and a cache bounded by the kept frames' bytes answers a repeated clip.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from concurrent.futures import Executor
from dataclasses import replace

from epd.common.errors import EpdError, InvalidArgument
from epd.server.media.cache import AsyncLruCache
from epd.server.media.fetch import fetch_url, url_scheme
from epd.server.media.hashing import source_key
from epd.server.media.image_settings import resolve_image
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_overrides import (
    NO_KWARGS,
    MediaKwargs,
    VideoOverrides,
    check_trusted,
    resolve,
)
from epd.server.media.video_planner import PlannedVideo, VideoPlanner

# The fetch guard's refusal of too many bytes, which for a video means its own limit.
FETCH_TOO_LARGE = "IMAGE_TOO_LARGE"


class VideoLoader:
    """Loads videos under one policy for one model's ``planner``."""

    def __init__(
        self,
        planner: VideoPlanner,
        policy: MediaPolicy,
        *,
        cache_items: int = 16,
        cache_bytes: int = 512 << 20,
        executor: Executor | None = None,
    ) -> None:
        """``cache_items`` / ``cache_bytes`` (kept frames' RGB bytes) bound the cache of
        planned videos; 0 items disables it (concurrent loads of one source are still shared).
        ``executor``: where videos are decoded (None: asyncio's default executor)."""
        self.planner = planner
        self.policy = policy
        self.executor = executor
        self.cache: AsyncLruCache[PlannedVideo] = AsyncLruCache(
            cache_items, max_bytes=cache_bytes, size_of=lambda video: int(video.frames.nbytes)
        )
        self.num_refused: Counter[str] = Counter()  # by error reason, for metrics
        self.num_decoded = 0
        self.server_kwargs = MediaKwargs(policy.mm_processor_kwargs, policy.media_io_kwargs)
        self.processor_keys, self.image_keys = planner.processor_keys()
        try:
            self.defaults = self._resolve(NO_KWARGS, has_images=True)
            # NOTE: and its image pixel budget, which the route resolves per request
            server, keys = self.server_kwargs, self.image_keys
            resolve_image(server, NO_KWARGS, image_keys=keys, max_pixels=policy.max_pixels)
        except InvalidArgument as e:
            raise ValueError(f"--{e.metadata['param'].split('.')[0].replace('_', '-')}: {e}") from e
        planner.check(self.defaults)

    def overrides(self, request: MediaKwargs, *, has_images: bool) -> VideoOverrides:
        """The video overrides of a request that sent ``request`` (refused as vLLM refuses them
        unless the policy trusts them) merged over the server's; ``has_images``: the request
        holds an image too (whose settings epd cannot change). InvalidArgument naming the key."""
        check_trusted(request, self.policy.trust_request_mm_kwargs)
        return self._resolve(request, has_images=has_images) if request else self.defaults

    def _resolve(self, request: MediaKwargs, *, has_images: bool) -> VideoOverrides:
        return resolve(
            self.server_kwargs,
            request,
            processor_keys=self.processor_keys,
            image_keys=self.image_keys,
            has_images=has_images,
        )

    async def load(
        self, *, url: str = "", data: bytes = b"", overrides: VideoOverrides | None = None
    ) -> PlannedVideo:
        """The planned video at ``url`` or in ``data`` (exactly one must be given) under
        ``overrides`` of the model's video settings (None: the server's, ``defaults``); a
        refusal (an EpdError: bad URL, too large, not a video, too long...) is counted by its
        reason."""
        overrides = self.defaults if overrides is None else overrides
        try:
            if bool(url) == bool(data):
                raise InvalidArgument(
                    "a media item needs exactly one of url or data", reason="BAD_MEDIA_ITEM"
                )
            if url and url_scheme(url) not in ("data", "file"):
                key = "url:" + url
            else:
                key = "bytes:" + source_key(data or url.encode())
            key = f"{overrides.key}|{key}" if overrides.key else key
            return await self.cache.get_or_load(
                key, lambda: self._fetch_and_plan(url, data, overrides)
            )
        except EpdError as e:
            self.num_refused[e.reason] += 1
            raise

    async def _fetch_and_plan(
        self, url: str, data: bytes, overrides: VideoOverrides
    ) -> PlannedVideo:
        raw = data or await fetch_video(url, self.policy)
        planned = await asyncio.get_running_loop().run_in_executor(
            self.executor, self.planner.load, raw, self.policy, overrides
        )
        self.num_decoded += 1
        return planned


async def fetch_video(url: str, policy: MediaPolicy) -> bytes:
    """The bytes behind ``url`` under the fetch guard and the video byte limit."""
    try:
        return await fetch_url(url, replace(policy, max_bytes=policy.max_video_bytes))
    except InvalidArgument as e:
        if e.reason != FETCH_TOO_LARGE:
            raise
        raise InvalidArgument(
            f"the video is larger than {policy.max_video_bytes} bytes (--media-max-video-mb)",
            reason="VIDEO_TOO_LARGE",
        ) from e
