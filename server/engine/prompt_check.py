"""Checks of a prompt against its images, shared by every engine backend (no torch ops)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage, Grid
from epd.server.models.family import ModelFamily


@dataclass(frozen=True, slots=True)
class VisionLayout:
    """Token ids and sizes of the model's image placeholders.

    An image's placeholder is ``vision_start_id`` followed by ``image_pad_id`` (Qwen families),
    or ``image_pad_id`` alone where ``vision_start_id`` is None (LLaVA-1.5); engines expand the
    image token to the image's rows, t x h x w / ``merge_size`` ** 2 of its grid.
    ``embedding_width``: the width of an image's embedding rows as engines take them (the text
    model's hidden size, or wider where the family carries more per row, e.g. DeepStack features).
    ``family``: the model's family (how embeddings enter vLLM), found once as the layout is made.
    ``image_start_ids`` / ``image_end_ids``: tokens the expansion puts before and after an image's
    rows (InternVL: ``<img>`` and ``</img>``; none for the others).
    ``video_pad_id``: the video token, after ``vision_start_id`` in a video's placeholder (None:
    the family takes no video). A prompt's ``EngineImage``s are its images in prompt order, then
    its videos in prompt order (``EngineImage.is_video``).
    ``video_prompt_tokens``: what a video's token expands to, from its grid and timestamps,
    where the family writes more than the video's rows (``ModelFamily.video_prompt_tokens``
    bound to the model's config and tokenizer; Qwen3-VL: each temporal patch's time as text,
    then its rows between vision start and end); None, or None for a video: its rows alone.
    """

    vision_start_id: int | None
    image_pad_id: int
    merge_size: int
    embedding_width: int
    family: ModelFamily
    image_start_ids: tuple[int, ...] = ()
    image_end_ids: tuple[int, ...] = ()
    video_pad_id: int | None = None
    video_prompt_tokens: Callable[[Grid, tuple[float, ...]], list[int] | None] | None = field(
        default=None, compare=False, repr=False
    )
    # tokens the expansion adds around each image's rows (its delimiters), set once as it is built
    num_delimiters: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "num_delimiters", len(self.image_start_ids) + len(self.image_end_ids)
        )

    @classmethod
    def of(cls, config: Any, tokenizer: Any = None) -> VisionLayout:
        """The layout of a model's transformers config (and its ``tokenizer``, which families
        whose rows sit between delimiter tokens need, and the videos' prompt tokens: without
        it a video counts its rows alone) as its family reads it (placeholder tokens, merge
        size, embedding width, delimiters, videos' prompt tokens); UnsupportedModel if no
        family serves its architecture, ValueError if the family needs the tokenizer and has
        none."""
        from epd.server.models.registry import family_of_config

        family = family_of_config(config)
        start_ids, end_ids = family.image_delimiters(config, tokenizer)
        return cls(
            vision_start_id=family.placeholder_start_id(config),
            image_pad_id=int(config.image_token_id),
            merge_size=family.merge_size(config),
            embedding_width=family.embedding_width(config),
            family=family,
            image_start_ids=tuple(start_ids),
            image_end_ids=tuple(end_ids),
            video_pad_id=getattr(config, "video_token_id", None),
            video_prompt_tokens=(
                None
                if tokenizer is None
                else partial(family.video_prompt_tokens, config=config, tokenizer=tokenizer)
            ),
        )

    def count_placeholders(self, token_ids: list[int]) -> tuple[int, int]:
        """The image placeholders and the video placeholders (the vision start, then the image
        or video token; the token alone where ``vision_start_id`` is None) in ``token_ids``,
        counted in one pass."""
        previous: list[int | None] = [None, *token_ids[:-1]]
        placed = Counter(
            token
            for token, before in zip(token_ids, previous, strict=True)
            if self.vision_start_id is None or before == self.vision_start_id
        )
        num_videos = 0 if self.video_pad_id is None else placed[self.video_pad_id]
        return placed[self.image_pad_id], num_videos

    def expand(self, token_ids: list[int], images: list[EngineImage]) -> list[int]:
        """``token_ids`` with each image's (and video's) one placeholder token repeated to its
        embedding rows.

        Every image needs its grid; call ``check`` first.
        """
        return self.expand_with_ranges(token_ids, images)[0]

    def expand_with_ranges(
        self, token_ids: list[int], images: list[EngineImage]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``expand``'s tokens, and each image's or video's placeholder run in them as
        (offset, length), in prompt order, an image's delimiters included, a video's run as
        its family writes it (``video_tokens``)."""
        expanded: list[int] = []
        ranges: list[tuple[int, int]] = []
        pictures = iter([(i, image) for i, image in enumerate(images) if not image.is_video])
        videos = iter([(i, image) for i, image in enumerate(images) if image.is_video])
        previous = None
        for token in token_ids:
            is_placed = self.vision_start_id is None or previous == self.vision_start_id
            if is_placed and token == self.image_pad_id:
                rows = self._expected_rows(*next(pictures))
                ranges.append((len(expanded), rows + self.num_delimiters))
                expanded.extend([*self.image_start_ids, *[token] * rows, *self.image_end_ids])
            elif is_placed and token == self.video_pad_id:
                run = self.video_tokens(*next(videos))
                ranges.append((len(expanded), len(run)))
                expanded.extend(run)
            else:
                expanded.append(token)
            previous = token
        return expanded, ranges

    def check(
        self,
        token_ids: list[int],
        images: list[EngineImage],
        max_len: int,
        *,
        grids_suffice: bool = False,
    ) -> None:
        """Raise InvalidArgument unless prompt and images agree and fit.

        ``grids_suffice``: an image may come with its grid only (decode after a remote prefill).
        """
        if not token_ids:
            raise InvalidArgument("the prompt has no tokens", reason="EMPTY_PROMPT")
        groups, num_video_groups = self.count_placeholders(token_ids)
        num_videos = sum(image.is_video for image in images)
        if groups != len(images) - num_videos:
            raise InvalidArgument(
                f"the prompt has {groups} image placeholders but {len(images) - num_videos} "
                "images were given",
                reason="IMAGE_COUNT_MISMATCH",
            )
        if num_video_groups != num_videos:
            raise InvalidArgument(
                f"the prompt has {num_video_groups} video placeholders but "
                f"{num_videos} videos were given",
                reason="VIDEO_COUNT_MISMATCH",
            )
        if any(image.is_video for image in images[: len(images) - num_videos]):
            raise InvalidArgument(
                "a prompt's videos come after its images", reason="BAD_VIDEO_ORDER"
            )
        expanded = len(token_ids) + sum(
            self._check_image(i, image, grids_suffice) - 1 for i, image in enumerate(images)
        )
        if expanded >= max_len:
            raise InvalidArgument(
                f"the prompt expands to {expanded} tokens; the engine's limit is {max_len - 1}",
                reason="PROMPT_TOO_LONG",
            )

    def _check_image(self, index: int, image: EngineImage, grids_suffice: bool) -> int:
        """The tokens image ``index``'s placeholder expands to (1 for a raw picture: vLLM
        expands it; a video, raw or not, its family's tokens from its grid and timestamps)."""
        if image.embeddings is None:
            if not (grids_suffice or image.is_raw):
                raise InvalidArgument(
                    f"image {index} has neither embeddings nor a picture",
                    reason="MISSING_IMAGE_DATA",
                )
            if image.is_video:
                return len(self.video_tokens(index, image))
            if image.image is not None:
                return 1
            return self._expected_rows(index, image) + self.num_delimiters
        expected = self._expected_rows(index, image)
        if image.timestamps and image.grid is not None and len(image.timestamps) != image.grid[0]:
            raise InvalidArgument(
                f"video {index} has {len(image.timestamps)} timestamps for {image.grid[0]} "
                "temporal patches",
                reason="BAD_GRID",
            )
        rows, width = (tuple(image.embeddings.shape) + (0, 0))[:2]
        if image.embeddings.dim() != 2 or rows != expected or width != self.embedding_width:
            raise InvalidArgument(
                f"image {index}: embeddings {list(image.embeddings.shape)} do not match grid "
                f"{list(image.grid or ())} (expected [{expected}, {self.embedding_width}])",
                reason="EMBEDDING_SHAPE_MISMATCH",
            )
        return (
            len(self.video_tokens(index, image))
            if image.is_video
            else expected + self.num_delimiters
        )

    def video_tokens(self, index: int, video: EngineImage) -> list[int]:
        """What video ``index``'s one token expands to: the tokens its family writes
        (``video_prompt_tokens``), else its rows of the video token."""
        rows = self._expected_rows(index, video)
        written = None
        if self.video_prompt_tokens is not None and video.grid is not None:
            written = self.video_prompt_tokens(video.grid, video.timestamps)
        return written or [self.video_pad_id or 0] * rows

    def _expected_rows(self, index: int, image: EngineImage) -> int:
        grid = image.grid
        if grid is None or any(v <= 0 for v in grid) or (grid[1] * grid[2]) % self.merge_size**2:
            raise InvalidArgument(f"image {index} has no valid grid", reason="BAD_GRID")
        return grid[0] * grid[1] * grid[2] // self.merge_size**2
