"""What a family decides about a video before any encoder runs, and how it refuses one.

Decoding (``epd.server.media.video``) finds how many frames a video has, at what rate and of
what size (a ``VideoClip``); the family's video processor settings then choose the frames to
keep, the size each is resized to, the grid and the token count, and the prompt's timing facts
(Qwen2.5-VL's seconds per temporal patch, Qwen3-VL's timestamps): a ``VideoPlan``, fixed once,
which every later hop trusts. Frames are grouped ``temporal_patch_size`` at a time into temporal
patches; the last patch of a clip of an odd count repeats the last frame.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

Grid = tuple[int, int, int]


class VideoRefused(ValueError):
    """A family cannot take this video (or any video); ``reason`` is the UPPER_SNAKE reason of
    the error the caller reports (``VIDEO_NOT_SUPPORTED``, ``VIDEO_TOO_SHORT``,
    ``BAD_VIDEO_SHAPE``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class VideoClip:
    """A decoded video as sampling sees it: ``num_frames`` that decoded, their mean rate
    ``fps`` (measured from their timestamps) and their size."""

    num_frames: int
    fps: float
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class VideoPlan:
    """What a family's video processor makes of a clip, from its sizes alone.

    ``frame_indices``: the frames kept, by index into the decoded ones, in order.
    ``resized``: (height, width) every kept frame is resized to. ``grid``: (t, h, w) in patches,
    t the number of temporal patches. ``num_tokens``: the embedding rows (placeholder tokens).
    ``sampling``: the sampling settings used, as text (part of the video's identity).
    ``seconds_per_temporal_patch``: Qwen2.5-VL's ``second_per_grid_ts`` (None for families
    without it). ``timestamps``: Qwen3-VL's time of each temporal patch in seconds, shown in
    the prompt (None for families without them).
    """

    frame_indices: tuple[int, ...]
    resized: tuple[int, int]
    grid: Grid
    num_tokens: int
    temporal_patch_size: int
    sampling: str
    seconds_per_temporal_patch: float | None = None
    timestamps: tuple[float, ...] | None = None

    @property
    def num_temporal_patches(self) -> int:
        return self.grid[0]

    @property
    def tokens_per_temporal_patch(self) -> int:
        return self.num_tokens // self.grid[0]


def sample_frames(clip: VideoClip, processor: Any, **settings: Any) -> tuple[int, ...]:
    """The indices of the decoded frames of ``clip`` that ``processor``'s own ``sample_frames``
    keeps under ``settings`` (its ``num_frames``/``fps`` keywords); a clip too short for them
    is VIDEO_TOO_SHORT."""
    from transformers.video_utils import VideoMetadata

    metadata = VideoMetadata(total_num_frames=clip.num_frames, fps=clip.fps)
    try:
        indices = processor.sample_frames(metadata, **settings)
    except (ValueError, ZeroDivisionError) as e:
        raise VideoRefused(
            f"a video of {clip.num_frames} frames is too short for this model's sampling: {e}",
            "VIDEO_TOO_SHORT",
        ) from e
    return tuple(int(index) for index in indices)


def with_settings(processor: Any, settings: dict[str, Any]) -> Any:
    """``processor`` (the checkpoint's video processor, shared: left as it is) or a copy of it
    with ``settings`` changed, as a request's ``mm_processor_kwargs`` change them for one call
    (``epd.server.media.video_overrides``): sampling (``fps`` and ``num_frames`` exclude each
    other, so setting one clears the other; ``min_frames``/``max_frames`` only where the
    processor's ``sample_frames`` takes them, as transformers passes them), and the pixel
    budget (``min_pixels`` / ``max_pixels`` are the ``size`` edges of a processor that budgets
    pixels, as Qwen's; any other processor refuses them with BAD_MEDIA_KWARGS)."""
    settings = {name: value for name, value in settings.items() if _takes(processor, name)}
    if not settings:
        return processor
    changed = copy.copy(processor)
    for name, other in (("fps", "num_frames"), ("num_frames", "fps")):
        if name in settings:
            setattr(changed, other, None)
    bounds = {
        edge: settings.pop(name)
        for name, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge"))
        if name in settings
    }
    if bounds:
        changed.size = _pixel_budget(processor, bounds)
    for name, value in settings.items():
        if not hasattr(processor, name):
            raise VideoRefused(
                f"this model's video processor has no {name} setting", "MEDIA_KWARGS_NOT_SUPPORTED"
            )
        setattr(changed, name, value)
    return changed


def _takes(processor: Any, name: str) -> bool:
    """Whether ``processor`` applies a call's ``name`` setting: transformers hands the frame
    bounds to ``sample_frames``, and Qwen3-VL's ignores them (it reads its own)."""
    import inspect

    if name not in ("min_frames", "max_frames"):
        return True
    return name in inspect.signature(processor.sample_frames).parameters


def _pixel_budget(processor: Any, bounds: dict[str, int]) -> Any:
    import dataclasses

    size: Any = processor.size
    edges = ("shortest_edge", "longest_edge")
    if isinstance(size, dict) or any(getattr(size, edge, None) is None for edge in edges):
        raise VideoRefused(
            "this model's video processor resizes to a fixed size, not within a pixel budget: "
            "min_pixels and max_pixels do not apply",
            "MEDIA_KWARGS_NOT_SUPPORTED",
        )
    return dataclasses.replace(size, **bounds)
