"""The patch grid the model's image processor will produce for an image (no torch, no grpc).

Qwen2-VL style processors resize each image so both sides are multiples of
``patch_size * merge_size`` and the pixel count lies within [min_pixels, max_pixels]; the grid is
(1, height / patch_size, width / patch_size) for a still image, and the image takes
``t * h * w / merge_size**2`` tokens in the expanded prompt.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

Grid = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class GridCalculator:
    """Processor settings that decide an image's grid."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> GridCalculator:
        """Read ``preprocessor_config.json`` of ``model_dir`` (defaults where a key is absent)."""
        path = Path(model_dir) / "preprocessor_config.json"
        config = json.loads(path.read_text()) if path.exists() else {}
        size = config.get("size") or {}
        defaults = cls()
        return cls(patch_size=int(config.get("patch_size", defaults.patch_size)),
                   merge_size=int(config.get("merge_size", defaults.merge_size)),
                   min_pixels=int(config.get("min_pixels") or size.get("shortest_edge")
                                  or defaults.min_pixels),
                   max_pixels=int(config.get("max_pixels") or size.get("longest_edge")
                                  or defaults.max_pixels))  # fmt: skip

    def grid(self, width: int, height: int) -> Grid:
        """(t, h, w) in patches for an image of ``width`` x ``height`` pixels."""
        resized_height, resized_width = self._resized(height, width)
        return 1, resized_height // self.patch_size, resized_width // self.patch_size

    def num_tokens(self, grid: Grid) -> int:
        """Tokens the image takes in the expanded prompt."""
        t, h, w = grid
        return t * h * w // self.merge_size**2

    def _resized(self, height: int, width: int) -> tuple[int, int]:
        # NOTE: mirrors transformers' qwen2_vl smart_resize, so the counts match the engine's.
        factor = self.patch_size * self.merge_size
        if max(height, width) / max(1, min(height, width)) > 200:
            raise ValueError(f"aspect ratio of {width}x{height} is above 200")
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar
