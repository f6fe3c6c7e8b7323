"""Video for the Qwen families, as their transformers video processors do it.

Sampling is the processor's own ``sample_frames`` on the decoded clip's frame count and measured
rate: ``fps`` frames a second within ``min_frames``..``max_frames`` (a fixed ``num_frames``
where the processor sets one). A processor saved with neither (Qwen2-VL's and Qwen2.5-VL's
transformers defaults) samples at ``DEFAULT_FPS``, the rate qwen-vl-utils feeds these models.
Frames are resized with the processor's ``smart_resize`` rule, its per-frame cap
(``cap_pixels_per_frame``) included: Qwen2/2.5-VL bound each frame's pixels, Qwen3-VL the
clip's (its ``smart_resize`` takes the frame count). The pixel values are the processor's own,
on frames resized here with its resize (``TorchvisionBackend.resize``), so a run of frames cut
at temporal patch boundaries gives the rows the whole clip gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epd.server.models.video import VideoClip, VideoPlan, VideoRefused, sample_frames

#: frames a second sampled when the processor sets neither ``fps`` nor ``num_frames``
DEFAULT_FPS = 2.0

#: (num_frames, height, width, processor) -> (resized height, resized width)
Resizer = Callable[[int, int, int, Any], tuple[int, int]]


def sampling_settings(processor: Any) -> dict[str, Any]:
    """The keyword arguments of ``processor.sample_frames`` that set how often to sample."""
    if processor.num_frames is not None:
        return {"num_frames": int(processor.num_frames)}
    return {"fps": float(processor.fps) if processor.fps is not None else DEFAULT_FPS}


def sample_indices(processor: Any, clip: VideoClip) -> tuple[int, ...]:
    """The decoded frames ``processor`` keeps of ``clip``."""
    return sample_frames(clip, processor, **sampling_settings(processor))


def plan(
    clip: VideoClip, processor: Any, resize: Resizer, timing: Callable[..., dict[str, Any]]
) -> VideoPlan:
    """The plan of ``clip``: ``processor``'s sampling, ``resize``'s size, and the family's
    ``timing`` facts (``timing(clip, indices, processor)``: VideoPlan's optional fields)."""
    indices = sample_indices(processor, clip)
    num_frames = len(indices)
    patch, temporal = int(processor.patch_size), int(processor.temporal_patch_size)
    try:
        height, width = resize(num_frames, clip.height, clip.width, processor)
    except ValueError as e:
        raise VideoRefused(
            f"video frames of {clip.width}x{clip.height} pixels cannot be resized by this "
            f"model's video processor: {e}",
            "BAD_VIDEO_SHAPE",
        ) from e
    grid = (-(-num_frames // temporal), height // patch, width // patch)
    return VideoPlan(
        frame_indices=indices,
        resized=(height, width),
        grid=grid,
        num_tokens=grid[0] * grid[1] * grid[2] // int(processor.merge_size) ** 2,
        temporal_patch_size=temporal,
        sampling=_sampling_text(processor),
        **timing(clip, indices, processor),
    )


def per_frame_resized(num_frames: int, height: int, width: int, processor: Any) -> tuple[int, int]:
    """Qwen2/2.5-VL: each frame within the processor's pixel bounds (and, capped, within its
    share of ``max_video_tokens``' pixels)."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import smart_resize

    factor = int(processor.patch_size) * int(processor.merge_size)
    min_pixels, max_pixels = _pixel_bounds(processor)
    if processor.cap_pixels_per_frame:
        total_pixels = int(processor.max_video_tokens * factor * factor * 0.9)
        share = total_pixels * int(processor.temporal_patch_size) // num_frames
        max_pixels = max(min(max_pixels, share), int(min_pixels * 1.05))
    resized = smart_resize(
        height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels
    )
    return int(resized[0]), int(resized[1])


def whole_clip_resized(num_frames: int, height: int, width: int, processor: Any) -> tuple[int, int]:
    """Qwen3-VL: the clip's frames together within the processor's pixel bounds (capped: each
    frame within ``max_video_tokens`` tokens' pixels too)."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    factor = int(processor.patch_size) * int(processor.merge_size)
    min_pixels, max_pixels = _pixel_bounds(processor)
    if processor.cap_pixels_per_frame:
        frame_cap = int(processor.max_video_tokens) * factor * factor
        per_frame = max(min(frame_cap, max_pixels // num_frames), int(min_pixels * 1.05))
        max_pixels = per_frame * num_frames
    resized = smart_resize(
        num_frames,
        height,
        width,
        temporal_factor=int(processor.temporal_patch_size),
        factor=factor,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )
    return int(resized[0]), int(resized[1])


def pixel_inputs(
    processor: Any, frames: Any, resized: tuple[int, int], device: str | None = None
) -> tuple[Any, Any]:
    """``processor``'s ``pixel_values_videos`` and ``video_grid_thw`` of ``frames`` (uint8
    [n, height, width, 3]) resized to ``resized`` (height, width)."""
    import torch
    from transformers.image_processing_backends import TorchvisionBackend
    from transformers.image_utils import SizeDict

    videos = torch.as_tensor(frames).permute(0, 3, 1, 2).contiguous()
    if device is not None:
        videos = videos.to(device)
    height, width = resized
    videos = TorchvisionBackend.resize(
        processor, videos, SizeDict(height=height, width=width), resample=processor.resample
    )
    inputs = processor(
        videos=[videos],
        do_resize=False,
        do_sample_frames=False,
        return_tensors="pt",
        device=device,
    )
    return inputs["pixel_values_videos"], inputs["video_grid_thw"]


def _pixel_bounds(processor: Any) -> tuple[int, int]:
    return int(processor.size["shortest_edge"]), int(processor.size["longest_edge"])


def _sampling_text(processor: Any) -> str:
    settings = sampling_settings(processor)
    settings.update(min_frames=int(processor.min_frames), max_frames=int(processor.max_frames))
    return " ".join(f"{key}={value}" for key, value in sorted(settings.items()))
