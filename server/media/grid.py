"""The (t, h, w) patch grid a model's own Hugging Face image processor makes of an image.

The route needs each image's grid before the encoder runs (placeholder expansion, block hashes,
encoder cost). This reads the processor of the model directory and applies the resize rule of
transformers' Qwen2-VL processor with that processor's own settings, so the numbers are the ones
``processor(images=...)["image_grid_thw"]`` produces, without resizing or normalising any pixel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from epd.server.common.errors import InvalidArgument

Grid = tuple[int, int, int]


class ImageGridder:
    """Grids and token counts for one model's image processor (cheap: no pixel work)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoImageProcessor

        processor: Any = AutoImageProcessor.from_pretrained(model_dir)
        # NOTE: transformers 5 keeps min/max pixels in size (shortest_edge / longest_edge); it
        # moves legacy min_pixels / max_pixels keys of preprocessor_config.json there on load.
        self.patch_size = int(processor.patch_size)
        self.merge_size = int(processor.merge_size)
        self.min_pixels = int(processor.size["shortest_edge"])
        self.max_pixels = int(processor.size["longest_edge"])

    def grid(self, image: Image.Image) -> Grid:
        """(t, h, w) in patches for ``image`` (t is 1 for a still image)."""
        return self.grid_of_size(image.width, image.height)

    def grid_of_size(self, width: int, height: int) -> Grid:
        """(t, h, w) for an image of ``width`` x ``height`` pixels."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        try:
            resized_height, resized_width = smart_resize(
                height, width, self.patch_size * self.merge_size,
                min_pixels=self.min_pixels, max_pixels=self.max_pixels,
            )  # fmt: skip
        except (ValueError, ZeroDivisionError) as e:
            raise InvalidArgument(f"image of {width}x{height} pixels cannot be encoded: {e}",
                                  reason="BAD_IMAGE_SHAPE") from e  # fmt: skip
        return 1, resized_height // self.patch_size, resized_width // self.patch_size

    def num_tokens(self, grid: Grid) -> int:
        """Embedding rows (= placeholder tokens) the image takes after the merger."""
        t, h, w = grid
        return t * h * w // self.merge_size**2
