"""Video for LLaVA-OneVision, as transformers' ``LlavaOnevisionVideoProcessor`` and
``LlavaOnevisionModel.get_video_features`` do it.

The processor keeps every decoded frame unless it samples (``do_sample_frames``: its
``sample_frames`` with its ``num_frames`` or ``fps``) and resizes each to its ``size`` (the
tower's square). The tower reads each frame alone (no temporal patches), its features go through
the projector and are pooled 2 x 2 bilinearly (``apply_pooling``: a side of s patches becomes
ceil(s / 2)); the ``image_newline`` row follows the video's last frame, once per video.

So a plan's grid is (frames, pooled side, pooled side) with a temporal patch of one frame and a
merge size of 1: a chunk is any run of frames and its rows are its frames' pooled rows. The
newline row is no chunk's: the engine appends it to the joined rows (``with_newline``), and the
video's placeholder holds one token more than its grid's rows. An image's grid is (1, 1, rows),
so a grid whose height is over 1 is a video chunk's (``is_video_grid``).
"""

from __future__ import annotations

import math
from typing import Any

from epd.server.models.family import Grid
from epd.server.models.video import VideoClip, VideoPlan, VideoRefused, sample_frames

#: the key of a video chunk's frames in the encoder's pixel inputs
VIDEO_PIXELS_KEY = "pixel_values_videos"


def pooled_side(config: Any) -> int:
    """Rows along each side of a frame after the 2 x 2 pooling (transformers' ``apply_pooling``)."""
    side = int(config.vision_config.image_size) // int(config.vision_config.patch_size)
    return math.ceil(side / 2)


def plan(clip: VideoClip, config: Any, processor: Any) -> VideoPlan:
    """The plan of ``clip``: the frames ``processor`` keeps, resized to its square, each
    ``pooled_side`` squared rows, one newline row for the video."""
    size = processor.size
    if size.get("height") is None or size.get("width") is None:
        raise VideoRefused(
            f"this model's video processor resizes to {dict(size)}, not to a height and width",
            "BAD_VIDEO_SHAPE",
        )
    indices = _kept_frames(clip, processor)
    side = pooled_side(config)
    if side < 2:
        raise VideoRefused("this model's frames pool to a single row", "BAD_VIDEO_SHAPE")
    return VideoPlan(
        frame_indices=indices,
        resized=(int(size["height"]), int(size["width"])),
        grid=(len(indices), side, side),
        num_tokens=len(indices) * side * side + 1,
        temporal_patch_size=1,
        sampling=_sampling_text(processor),
    )


def _kept_frames(clip: VideoClip, processor: Any) -> tuple[int, ...]:
    if not processor.do_sample_frames:
        return tuple(range(clip.num_frames))
    return sample_frames(clip, processor, num_frames=processor.num_frames, fps=processor.fps)


def _sampling_text(processor: Any) -> str:
    settings = {
        "do_sample_frames": bool(processor.do_sample_frames),
        "fps": processor.fps,
        "num_frames": processor.num_frames,
    }
    return " ".join(f"{key}={value}" for key, value in sorted(settings.items()))


def pixel_inputs(
    processor: Any,
    frames: Any,
    resized: tuple[int, int],
    side: int,
    device: str | None = None,
) -> tuple[Any, Any]:
    """``processor``'s pixel values of ``frames`` (uint8 [n, height, width, 3]) resized to
    ``resized`` (height, width), as a ``BatchFeature`` of ``VIDEO_PIXELS_KEY`` [n, 3, height,
    width], and the grid [[n, side, side]]."""
    import torch
    from transformers import BatchFeature

    videos = torch.as_tensor(frames).permute(0, 3, 1, 2).contiguous()
    height, width = resized
    inputs = processor(
        videos=[videos],
        do_sample_frames=False,
        size={"height": height, "width": width},
        return_tensors="pt",
        device=device,
    )
    pixels = inputs["pixel_values_videos"][0]
    grid = torch.tensor([[int(pixels.shape[0]), side, side]])
    return BatchFeature({VIDEO_PIXELS_KEY: pixels}), grid


def is_video_grid(grid: Grid | Any) -> bool:
    """Whether ``grid`` (t, h, w) is a video chunk's (an image's is (1, 1, rows))."""
    return int(grid[1]) > 1


def frame_rows(tower: Any, frames: Any) -> Any:
    """Each frame's pooled rows, in order, [n x side x side, hidden], as transformers'
    ``get_video_features`` gives them before the newline row: the tower's hidden states at
    ``vision_feature_layer`` through the projector, pooled 2 x 2."""
    import torch
    from transformers.models.llava_onevision.modeling_llava_onevision import (
        LlavaOnevisionModel,
    )

    config = tower.config
    layers = config.vision_feature_layer
    layers = [layers] if isinstance(layers, int) else list(layers)
    hidden = tower.vision_tower(frames, output_hidden_states=True).hidden_states
    chosen = torch.cat([hidden[layer] for layer in layers], dim=-1)
    if config.vision_feature_select_strategy == "default":
        chosen = chosen[:, 1:]
    pooled = LlavaOnevisionModel.apply_pooling(tower, tower.multi_modal_projector(chosen))
    return pooled.flatten(0, 1)


def with_newline(model: Any, rows: Any) -> Any:
    """A video's joined rows [n x side x side, hidden] with the ``image_newline`` row of
    ``model`` (a loaded ``LlavaOnevisionForConditionalGeneration``) after its last frame."""
    import torch

    newline = model.model.image_newline.to(rows.device, rows.dtype)
    return torch.cat([rows, newline[None]])
