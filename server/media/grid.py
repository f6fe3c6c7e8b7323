"""The (t, h, w) grid a model's own Hugging Face image processor makes of an image.

The route needs each image's grid before the encoder runs (placeholder expansion, block hashes,
encoder cost). This reads the processor of the model directory and applies its family's rule
(``epd.server.models``, ``image_grid``) with that processor's own settings, so the numbers are the
ones the processor produces (Qwen families: its ``image_grid_thw``; LLaVA-1.5: (1, 1, rows)),
without resizing or normalising any pixel.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings, resolve_image
from epd.server.media.video_overrides import MediaKwargs

Grid = tuple[int, int, int]


class ImageGridder:
    """Grids and token counts for one model's image processor (cheap: no pixel work)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoConfig, AutoImageProcessor

        from epd.server.models.registry import family_of

        self.family = family_of(model_dir)
        self.config: Any = AutoConfig.from_pretrained(model_dir)
        self.processor: Any = AutoImageProcessor.from_pretrained(model_dir)
        self.merge_size = self.family.merge_size(self.config)
        valid = getattr(self.processor, "valid_kwargs", None)
        self.image_keys = frozenset(getattr(valid, "__annotations__", {}))

    def grid(self, image: Image.Image) -> Grid:
        """(t, h, w) in patches for ``image`` (t is 1 for a still image)."""
        return self.grid_of_size(image.width, image.height)

    def budget(self, server: MediaKwargs, request: MediaKwargs, max_pixels: int) -> ImageSettings:
        """The whole pixel budget (``ModelFamily.image_pixel_budget``) of an image under
        ``request``'s ``mm_processor_kwargs`` merged over the ``server``'s (``resolve_image``,
        within the policy's ``max_pixels``); none when they set none. InvalidArgument naming
        the key, MEDIA_KWARGS_NOT_SUPPORTED where the model's processor has no pixel budget."""
        given = resolve_image(server, request, image_keys=self.image_keys, max_pixels=max_pixels)
        try:
            return ImageSettings(**self.family.image_pixel_budget(self.processor, given.settings))
        except ValueError as e:
            reason, param = "MEDIA_KWARGS_NOT_SUPPORTED", {"param": "mm_processor_kwargs"}
            raise InvalidArgument(str(e), reason=reason, metadata=param) from e

    def grid_of_size(
        self, width: int, height: int, settings: ImageSettings = NO_IMAGE_SETTINGS
    ) -> Grid:
        """(t, h, w) for an image of ``width`` x ``height`` pixels resized within
        ``settings``."""
        ratio = self.family.max_aspect_ratio
        short_side, long_side = sorted((width, height))
        if short_side <= 0 or (ratio is not None and long_side > ratio * short_side):
            raise _bad_shape(width, height, ratio)
        processor = self.processor
        if settings.key:
            processor = self.family.image_processor_within(processor, settings.settings)
        try:
            return self.family.image_grid(width, height, self.config, processor)
        except ValueError as e:
            raise InvalidArgument(
                f"image of {width}x{height} pixels cannot be resized by this model's image "
                f"processor: {e}",
                reason="BAD_IMAGE_SHAPE",
            ) from e

    def num_tokens(self, grid: Grid) -> int:
        """Embedding rows (= placeholder tokens) the image takes after the merger."""
        t, h, w = grid
        return t * h * w // self.merge_size**2


def _bad_shape(width: int, height: int, max_aspect_ratio: int | None) -> InvalidArgument:
    """The refusal of an empty image, or of one whose sides are further apart than
    ``max_aspect_ratio``, saying how to make it fit."""
    if width <= 0 or height <= 0 or max_aspect_ratio is None:
        return InvalidArgument(
            f"image of {width}x{height} pixels is empty", reason="BAD_IMAGE_SHAPE"
        )
    long_side, short_side = max(width, height), min(width, height)
    padded_short, cropped_long = (
        math.ceil(long_side / max_aspect_ratio),
        short_side * max_aspect_ratio,
    )
    if width >= height:
        padded, cropped = (width, padded_short), (cropped_long, height)
    else:
        padded, cropped = (padded_short, height), (width, cropped_long)
    ratio = math.ceil(long_side / short_side * 10) / 10
    return InvalidArgument(
        f"image of {width}x{height} pixels has an aspect ratio of {ratio:g}:1; this model's image "
        f"processor accepts at most {max_aspect_ratio}:1: pad the image to at least "
        f"{padded[0]}x{padded[1]} or crop it to at most {cropped[0]}x{cropped[1]} pixels",
        reason="BAD_IMAGE_SHAPE",
    )
