"""Load one media item (URL or bytes) into an RGB image with its mm_hash, cached."""

from __future__ import annotations

import asyncio
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from epd.common.errors import EpdError, InvalidArgument
from epd.server.media.cache import AsyncLruCache
from epd.server.media.decode import decode_image, open_image
from epd.server.media.fetch import decode_data_url, fetch_url, url_scheme
from epd.server.media.hashing import mm_hash, processor_fingerprint, source_key
from epd.server.media.policy import MediaPolicy

# Images given as bytes (or a data: URL) of at most this many pixels (declared in their header) are
# decoded on the event loop: that costs less than the hand-off to a thread and back.
INLINE_DECODE_PIXELS = 256 * 256


@dataclass(frozen=True, slots=True)
class LoadedImage:
    """A decoded image, as its RGB pixels (uint8 [height, width, 3], never written: shared by
    every request for the same source), its content hash and its size in pixels."""

    pixels: np.ndarray
    mm_hash: str
    width: int
    height: int

    @property
    def image(self) -> Image.Image:
        """A Pillow image of the pixels (a copy), for engines that take one."""
        return Image.fromarray(self.pixels)


class MediaLoader:
    """Loads items under one policy for one model; identical sources load once."""

    def __init__(
        self,
        policy: MediaPolicy,
        *,
        model_id: str,
        processor_fingerprint: str,
        cache_items: int = 256,
        cache_bytes: int = 256 << 20,
        executor: Executor | None = None,
    ) -> None:
        """``cache_items`` / ``cache_bytes`` (decoded RGB bytes) bound the cache of decoded
        images; 0 items disables it (concurrent loads of one source are still shared).
        ``executor``: where images too large to decode on the event loop are decoded (None:
        asyncio's default executor)."""
        self.executor = executor
        self.policy = policy
        self.model_id = model_id
        self.processor_fingerprint = processor_fingerprint
        # NOTE: a byte budget, not only a count: 256 images at the pixel limit would be ~24 GiB.
        self.cache: AsyncLruCache[LoadedImage] = AsyncLruCache(
            cache_items, max_bytes=cache_bytes, size_of=lambda loaded: loaded.pixels.nbytes
        )
        self.num_refused: Counter[str] = Counter()  # by error reason, for metrics
        self.num_decoded = 0  # images decoded (and hashed): loads that missed the cache

    @classmethod
    def for_model(
        cls,
        policy: MediaPolicy,
        model_dir: str | Path,
        *,
        model_id: str,
        executor: Executor | None = None,
    ) -> MediaLoader:
        """A loader for the checkpoint in ``model_dir`` served as ``model_id``, whose mm_hashes
        cover that model's processor settings (``processor_fingerprint``), read once here."""
        fingerprint = processor_fingerprint(model_dir)
        return cls(policy, model_id=model_id, processor_fingerprint=fingerprint, executor=executor)

    async def load(self, *, url: str = "", data: bytes = b"") -> LoadedImage:
        """Decode the image at ``url`` or in ``data`` (exactly one must be given; a data: URL
        is its payload's bytes). A refusal (an EpdError: bad URL, too large, not an image...)
        is counted by its reason."""
        try:
            if bool(url) == bool(data):
                raise InvalidArgument(
                    "a media item needs exactly one of url or data", reason="BAD_MEDIA_ITEM"
                )
            if url_scheme(url) == "data":
                url, data = "", decode_data_url(url, self.policy)
            if url:
                return await self.cache.get_or_load("url:" + url, lambda: self._fetch_and_load(url))
            key = "bytes:" + source_key(data)
            image = open_image(data, self.policy)
            if image.width * image.height <= INLINE_DECODE_PIXELS:
                return self.cache.get_or_compute(key, lambda: self._decode_and_hash(data, image))
            return await self.cache.get_or_load(key, lambda: self._off_loop(data, image))
        except EpdError as e:
            self.num_refused[e.reason] += 1
            raise

    async def _fetch_and_load(self, url: str) -> LoadedImage:
        # NOTE: decoded off the event loop whatever its size: the fetch costs more than the
        # hand-off to a thread.
        raw = await fetch_url(url, self.policy)
        return await self._off_loop(raw, open_image(raw, self.policy))

    async def _off_loop(self, raw: bytes, image: Image.Image) -> LoadedImage:
        # NOTE: decoding and hashing both walk every pixel: off the event loop.
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self._decode_and_hash, raw, image
        )

    def _decode_and_hash(self, raw: bytes, image: Image.Image) -> LoadedImage:
        """``raw`` (``image``: as ``open_image`` opened it) decoded and hashed."""
        # NOTE: np.array, not np.asarray: Pillow's array is read-only, which torch refuses to wrap.
        pixels = np.array(decode_image(raw, self.policy, image))
        digest = mm_hash(
            pixels, model_id=self.model_id, processor_fingerprint=self.processor_fingerprint
        )
        self.num_decoded += 1
        height, width = pixels.shape[:2]
        return LoadedImage(pixels, digest, width, height)
