"""What an encoder encodes, made ready for the tower (no grpc).

Three sources reach the tower: an image loaded here from its source (``LoadedImage``), the
route's decoded pixels of an image or of a video chunk's frames, read through the data plane
(``SharedPixels``), and a video chunk's frames loaded here from the video's source
(``VideoFrames``). The route tags its shared-memory segment with the item's mm_hash
(``payload_layout``) and only the route writes it, so its pixels are trusted as that item after
a check of the tag before and after reading them, whatever their size; pixels that cannot be
read here, or carry another tag, are no source (the worker loads the item's source instead).

Each is prepared (the model's processor) in a pool, in parallel with the tower running the
previous batch, unless it is small enough that the hand-off would cost more.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from epd.common.errors import EpdError
from epd.server.encode.video_items import VideoSpan
from epd.server.encode.vision import Prepared
from epd.server.media.hashing import pixels_tag
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings
from epd.server.media.loader import INLINE_DECODE_PIXELS, LoadedImage
from epd.server.media.pixels import check_frames, check_pixels
from epd.server.media.policy import MediaPolicy
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2

# (frames uint8 [n, height, width, 3], resized (height, width)) -> pixel inputs for the tower
PrepareVideo = Callable[[torch.Tensor, tuple[int, int]], Prepared]
# (pixels uint8 [height, width, 3], the pixel budget to resize within) -> pixel inputs
PrepareImage = Callable[[torch.Tensor, ImageSettings], Prepared]
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SharedPixels:
    """An image's pixels, or a video chunk's frames, shared by the route, tagged with their
    mm_hash."""

    ref: tensor_pb2.TensorRef
    mm_hash: str
    video: VideoSpan | None = None


@dataclass(frozen=True, slots=True)
class VideoFrames:
    """A video chunk's frames, loaded here from the video's source."""

    frames: np.ndarray
    video: VideoSpan


Source = SharedPixels | LoadedImage | VideoFrames


class Preparer:
    """Sources made ready for the tower. ``prepare_image`` (thread-safe) makes an image's RGB
    pixels ready, ``prepare_video`` (thread-safe; None: the encoder takes no video) a video
    chunk's frames, in ``pool`` (None: asyncio's default executor); the route's pixels are
    read from ``plane`` and checked against ``policy``."""

    def __init__(
        self,
        prepare_image: PrepareImage,
        plane: DataPlane,
        policy: MediaPolicy,
        *,
        pool: Executor | None = None,
        prepare_video: PrepareVideo | None = None,
    ) -> None:
        self.prepare_image = prepare_image
        self.prepare_video = prepare_video
        self.plane = plane
        self.policy = policy
        self.pool = pool

    async def prepare(
        self, source: Source, settings: ImageSettings = NO_IMAGE_SETTINGS
    ) -> Prepared | None:
        """``source`` prepared for the tower, an image's resized within ``settings``: in the pool
        (reading and preparing pixels off the event loop) unless it is so small that the
        hand-off would cost more. None when the route's shared pixels cannot be read here, or
        no longer hold the image they are tagged with once read (the lease was released
        meanwhile): then the source is loaded."""
        run: Callable[[], Prepared]
        if isinstance(source, SharedPixels):
            run = partial(self._prepare_shared, source, settings)
            num_values = math.prod(source.ref.shape)
        elif isinstance(source, LoadedImage):
            pixels = torch.from_numpy(source.pixels)
            run, num_values = partial(self.prepare_image, pixels, settings), pixels.numel()
        else:
            assert self.prepare_video is not None  # NOTE: the worker refuses video items without
            frames = torch.from_numpy(source.frames)
            run = partial(self.prepare_video, frames, source.video.resized)
            num_values = frames.numel()
        try:
            if num_values <= 3 * INLINE_DECODE_PIXELS:
                return run()
            return await asyncio.get_running_loop().run_in_executor(self.pool, run)
        except EpdError as e:
            if not isinstance(source, SharedPixels):
                raise
            logger.debug("pixels of %s unreadable here (%s): loading the source", source.mm_hash, e)
            return None

    def _prepare_shared(self, source: SharedPixels, settings: ImageSettings) -> Prepared:
        """The route's pixels of ``source`` (tagged by the route with its mm_hash: a check of
        their segment's stamp, whatever the image's size) read, checked and prepared, then
        found still tagged so (their lease was not released while they were read); EpdError
        otherwise."""
        tag = pixels_tag(source.mm_hash)
        pixels = self.plane.get(source.ref, content_tag=tag)
        if source.video is None:
            prepared = self.prepare_image(check_pixels(pixels, self.policy), settings)
        else:
            assert self.prepare_video is not None  # NOTE: the worker refuses video items without
            limit = self.policy.max_video_frame_pixels
            frames = check_frames(pixels, source.video.num_frames, limit)
            prepared = self.prepare_video(frames, source.video.resized)
        self.plane.check(source.ref, tag)
        return prepared
