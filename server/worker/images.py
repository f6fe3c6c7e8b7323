"""ImageInput messages -> EngineImage (no grpc): pull embeddings or load raw images.

Embeddings are pulled through the data plane as private copies, onto the device the worker's
engine takes them on, so the caller may release the encoder's leases as soon as the call returns.
Embeddings in a shared-memory segment that their encoder tagged with the image's mm_hash are
bound to that image (``EngineImage.is_bound``): engines name them by it, without hashing them.
Raw images (an encode_prefill worker's) come as the route's decoded pixels where the route shared
them on this host, in a segment it tagged with the image's mm_hash: neither decoded nor hashed
again (one decode and one hash per image per deployment); else they are loaded under the media
rules. Raw videos likewise (``video_frames``): the route's kept frames and its plan.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from PIL import Image

from epd.common.errors import EpdError, FailedPrecondition, InvalidArgument
from epd.server.engine.base import EngineImage, Grid
from epd.server.media.hashing import (
    embeddings_tag,
    is_mm_hash,
    pixels_tag,
    salted,
    under_settings,
)
from epd.server.media.image_settings import image_settings_of
from epd.server.media.loader import MediaLoader
from epd.server.media.pixels import check_pixels
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.transfer.plane import DataPlane, is_accelerator
from epd.server.worker.video_frames import raw_video
from epd.v1 import multimodal_pb2, tensor_pb2
from epd.v1.multimodal_pb2 import ImageInput

logger = logging.getLogger(__name__)


def grid_of(item: multimodal_pb2.ImageInput | multimodal_pb2.VideoInput) -> Grid | None:
    """The image's or video's (t, h, w) patch grid, or None when the message has none."""
    return (item.grid.t, item.grid.h, item.grid.w) if item.HasField("grid") else None


class ImageResolver:
    """Turns a prompt's ImageInputs into engine images for one worker."""

    def __init__(
        self,
        plane: DataPlane,
        loader: MediaLoader | None = None,
        *,
        device: str = "",
        videos: VideoLoader | None = None,
    ) -> None:
        """``loader`` None: raw images are refused (the worker takes embeddings only);
        ``device``: where embeddings are read into (its engine's ``embeddings_device``; empty
        or ``cpu``: host memory); ``videos``: decodes a raw video's source where the route's
        frames cannot be read (None: such a video is refused)."""
        self.plane = plane
        self.loader = loader
        self.device = device
        self.videos = videos

    async def resolve(
        self,
        images: Sequence[multimodal_pb2.ImageInput],
        videos: Sequence[multimodal_pb2.VideoInput] = (),
    ) -> list[EngineImage]:
        """A prompt's engine images as engines take them: its images in prompt order
        (embeddings copied out of the data plane), then its videos in prompt order (each
        video's chunk embeddings copied out and joined in order, bound to the video when their
        encoders bound every chunk; or, for a worker that takes raw images, its kept frames:
        ``video_frames.raw_video``)."""
        resolved = [await self._resolve(i, image) for i, image in enumerate(images)]
        for index, video in enumerate(videos):
            if video.HasField("media"):
                if self.loader is None:
                    raise FailedPrecondition(
                        "this worker takes video embeddings, not raw videos; send raw videos "
                        "to an encode_prefill worker",
                        reason="RAW_VIDEOS_UNSUPPORTED",
                    )
                resolved.append(await raw_video(self.plane, self.videos, index, video))
            else:
                resolved.append(self._resolve_video(index, video))
        return resolved

    def _resolve_video(self, index: int, video: multimodal_pb2.VideoInput) -> EngineImage:
        if not video.chunks or len(video.chunk_hashes) != len(video.chunks):
            raise InvalidArgument(
                f"video {index} needs its chunks' embeddings, each with its content hash",
                reason="MISSING_IMAGE_DATA",
            )
        read = [
            self._embeddings(ref, chunk_hash)
            for ref, chunk_hash in zip(video.chunks, video.chunk_hashes, strict=True)
        ]
        parts = [tensor for tensor, _ in read]
        return EngineImage(
            video.mm_hash,
            grid_of(video),
            embeddings=torch.cat(parts) if len(parts) > 1 else parts[0],
            is_bound=all(is_bound for _, is_bound in read),
            seconds_per_temporal_patch=video.seconds_per_temporal_patch,
            timestamps=tuple(video.timestamps),
        )

    async def _resolve(self, index: int, image: multimodal_pb2.ImageInput) -> EngineImage:
        source = image.WhichOneof("source")
        if source == "embeddings":
            tensor, is_bound = self._embeddings(image.embeddings, image.mm_hash)
            return EngineImage(image.mm_hash, grid_of(image), embeddings=tensor, is_bound=is_bound)
        if source == "media":
            if self.loader is None:
                raise FailedPrecondition(
                    "this worker takes image embeddings, not raw images; "
                    "send raw images to an encode_prefill worker",
                    reason="RAW_IMAGES_UNSUPPORTED",
                )
            return await self._raw_picture(image, self.loader)
        raise InvalidArgument(
            f"image {index} has neither embeddings nor media", reason="MISSING_IMAGE_DATA"
        )

    async def _raw_picture(self, image: ImageInput, loader: MediaLoader) -> EngineImage:
        """A raw picture of ``image`` (the route's pixels, else its source loaded), to be
        resized within its pixel budget (``MediaItem.image_settings``), named by its mm_hash."""
        media = image.media
        settings = image_settings_of(media.image_settings, loader.policy.max_pixels)
        shared = self._shared_picture(media, loader.policy)
        if shared is not None:
            return EngineImage(media.mm_hash, grid_of(image), image=shared, image_settings=settings)
        loaded = await loader.load(url=media.url, data=media.data)
        # NOTE: named under its budget; a tenant's keeps its salted name in vLLM's caches
        name = salted(under_settings(loaded.mm_hash, settings.key), media.key_salt)
        return EngineImage(name, grid_of(image), image=loaded.image, image_settings=settings)

    def _shared_picture(
        self, media: multimodal_pb2.MediaItem, policy: MediaPolicy
    ) -> Image.Image | None:
        """The route's decoded pixels of ``media`` as a picture of the image its mm_hash names,
        if the route shared them in a segment it tagged with that mm_hash (only the route
        writes that tag) and they were still tagged so once copied (a copying read checks
        that); else None (another host, released, none shared): then the source is loaded."""
        if not (media.HasField("pixels") and is_mm_hash(media.mm_hash)):
            return None
        tag = pixels_tag(media.mm_hash)
        try:
            pixels = self.plane.get(media.pixels, copy=True, content_tag=tag)
            return Image.fromarray(check_pixels(pixels, policy).numpy())
        except EpdError as e:
            logger.debug("pixels of %s unreadable here (%s): loading the source", media.mm_hash, e)
            return None

    def _embeddings(self, ref: tensor_pb2.TensorRef, mm_hash: str) -> tuple[torch.Tensor, bool]:
        """A copy of the embeddings ``ref`` points to, on the engine's device, and whether they
        are bound to the image ``mm_hash``: their shared-memory segment carries its content tag
        (their encoder's word, which only it can write). Unbound embeddings are read as they
        are, and engines name them by their bytes."""
        in_shared_memory = ref.WhichOneof("location") == "shm"
        if mm_hash and in_shared_memory and not is_accelerator(self.device):
            try:
                return self.plane.get(ref, copy=True, content_tag=embeddings_tag(mm_hash)), True
            except FailedPrecondition as e:
                if e.reason != "CONTENT_MISMATCH":
                    raise
        return self.plane.get(ref, copy=True, device=self.device), False
