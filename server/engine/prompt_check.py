"""Checks of a prompt against its images, shared by every engine backend (no torch ops)."""

from __future__ import annotations

from dataclasses import dataclass

from epd.server.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage


@dataclass(frozen=True, slots=True)
class VisionLayout:
    """Token ids and sizes of the model's image placeholders."""

    vision_start_id: int
    image_pad_id: int
    merge_size: int
    hidden_size: int

    def count_images(self, token_ids: list[int]) -> int:
        """Image placeholder groups (<|vision_start|><|image_pad|>) in ``token_ids``."""
        return sum(1 for a, b in zip(token_ids, token_ids[1:], strict=False)
                   if a == self.vision_start_id and b == self.image_pad_id)  # fmt: skip

    def check(self, token_ids: list[int], images: list[EngineImage], max_len: int) -> None:
        """Raise InvalidArgument unless prompt and images agree and fit."""
        if not token_ids:
            raise InvalidArgument("the prompt has no tokens", reason="EMPTY_PROMPT")
        groups = self.count_images(token_ids)
        if groups != len(images):
            raise InvalidArgument(f"the prompt has {groups} image placeholders but {len(images)} "
                                  "images were given", reason="IMAGE_COUNT_MISMATCH")  # fmt: skip
        expanded = len(token_ids) + sum(self._check_image(i, image) - 1
                                        for i, image in enumerate(images))  # fmt: skip
        if expanded >= max_len:
            raise InvalidArgument(f"the prompt expands to {expanded} tokens; the engine's limit "
                                  f"is {max_len - 1}", reason="PROMPT_TOO_LONG")  # fmt: skip

    def _check_image(self, index: int, image: EngineImage) -> int:
        if image.embeddings is None:
            if image.image is None:
                raise InvalidArgument(f"image {index} has neither embeddings nor a picture",
                                      reason="MISSING_IMAGE_DATA")  # fmt: skip
            return 1
        if image.grid is None or any(v <= 0 for v in image.grid):
            raise InvalidArgument(f"image {index} has no valid grid", reason="BAD_GRID")
        t, h, w = image.grid
        expected = t * h * w // self.merge_size**2
        rows, width = (tuple(image.embeddings.shape) + (0, 0))[:2]
        if image.embeddings.dim() != 2 or rows != expected or width != self.hidden_size:
            raise InvalidArgument(
                f"image {index}: embeddings {list(image.embeddings.shape)} do not match grid "
                f"{list(image.grid)} (expected [{expected}, {self.hidden_size}])",
                reason="EMBEDDING_SHAPE_MISMATCH",
            )  # fmt: skip
        return expected
