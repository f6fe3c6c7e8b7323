"""Qwen2-VL and Qwen2.5-VL: one placeholder group per image
(``<|vision_start|><|image_pad|><|vision_end|>``, expanded to the image's merged patches),
transformers' ``smart_resize`` rule (sides multiples of patch x merge, pixels within the
processor's bounds), M-RoPE positions from the image grid, and embeddings that enter vLLM as
``image_embeds`` + ``image_grid_thw``. The two differ in the vision tower (Qwen2.5-VL: window
attention, RMSNorm, gated MLP) and its config's field names. Videos are sampled, resized and
patched by their video processor (``qwen_video``): each frame within the pixel bounds, two frames
a temporal patch; Qwen2.5-VL's positions need the seconds each temporal patch spans.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from epd.server.models import qwen_video
from epd.server.models.family import Grid, ModelFamily
from epd.server.models.video import VideoClip, VideoPlan


class _QwenVl(ModelFamily):
    """What Qwen2-VL and Qwen2.5-VL share."""

    visual_prefixes = ("model.visual.", "visual.")
    packs_images = True
    # NOTE: smart_resize's own bound: it refuses a longer side over 200x the shorter.
    max_aspect_ratio = 200

    def vision_tower(self, config: Any) -> Any:
        return self._vision_tower_class()._from_config(config.vision_config)

    def placeholder_start_id(self, config: Any) -> int | None:
        return int(config.vision_start_token_id)

    def merge_size(self, config: Any) -> int:
        return int(config.vision_config.spatial_merge_size)

    def image_grid(self, width: int, height: int, config: Any, processor: Any) -> Grid:
        # NOTE: transformers 5 keeps min/max pixels in size (shortest_edge / longest_edge); it
        # moves legacy min_pixels / max_pixels keys of preprocessor_config.json there on load.
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        patch_size = int(processor.patch_size)
        resized_height, resized_width = smart_resize(
            height,
            width,
            patch_size * int(processor.merge_size),
            min_pixels=int(processor.size["shortest_edge"]),
            max_pixels=int(processor.size["longest_edge"]),
        )
        return 1, int(resized_height) // patch_size, int(resized_width) // patch_size

    def image_pixel_budget(self, processor: Any, given: dict[str, int]) -> dict[str, int]:
        if not given:
            return {}
        size = processor.size
        own = {"min_pixels": int(size["shortest_edge"]), "max_pixels": int(size["longest_edge"])}
        return {**own, **given}

    def image_processor_within(self, processor: Any, budget: dict[str, int]) -> Any:
        if not budget:
            return processor
        changed = copy.copy(processor)
        size = processor.size
        changed.size = dataclasses.replace(
            size,
            shortest_edge=budget.get("min_pixels", size.shortest_edge),
            longest_edge=budget.get("max_pixels", size.longest_edge),
        )
        return changed

    def positions(
        self, model: Any, ids: Any, is_image: Any, grids: Any, videos: Any = None
    ) -> tuple[Any, int]:
        import torch

        if not bool(is_image.any()) and videos is None:
            return torch.arange(ids.shape[1], device=ids.device).expand(3, 1, -1), 0
        types, extra = is_image.int(), {}
        if videos is not None:
            is_video, video_grids, seconds = videos
            types = types + 2 * is_video.int()
            extra = {"video_grid_thw": video_grids, "second_per_grid_ts": seconds}
        positions, deltas = model.model.get_rope_index(
            ids,
            mm_token_type_ids=types,
            image_grid_thw=grids if bool(is_image.any()) else None,
            **extra,
        )
        return positions, int(deltas.flatten()[0])

    def decode_positions(self, position: int, device: Any) -> Any:
        import torch

        return torch.full((3, 1, 1), position, device=device)

    def vllm_data(self, embeddings: list[Any], grids: list[Grid]) -> Any:
        import torch

        return {"image_embeds": torch.cat(embeddings), "image_grid_thw": torch.tensor(grids)}

    def vllm_video_data(
        self,
        embeddings: list[Any],
        grids: list[Grid],
        seconds_per_temporal_patch: list[float],
        timestamps: list[tuple[float, ...]],
    ) -> Any:
        import torch

        data: dict[str, Any] = {
            "video_embeds": torch.cat(embeddings),
            "video_grid_thw": torch.tensor(grids),
        }
        if any(seconds_per_temporal_patch):
            # NOTE: Qwen2.5-VL's; vLLM's Qwen2-VL positions take none (1.0 a temporal patch).
            data["second_per_grid_ts"] = torch.tensor(seconds_per_temporal_patch)
        if any(timestamps):
            # NOTE: Qwen3-VL's; vLLM writes each as "<t seconds>" when it expands the video.
            data["timestamps"] = [
                torch.tensor(seconds, dtype=torch.float64) for seconds in timestamps
            ]
        return data

    def plan_video(self, clip: VideoClip, config: Any, processor: Any) -> VideoPlan:
        return qwen_video.plan(clip, processor, self._video_resized, self._video_timing)

    def video_pixel_inputs(
        self,
        processor: Any,
        frames: Any,
        resized: tuple[int, int],
        device: str | None = None,
        config: Any = None,
    ) -> tuple[Any, Any]:
        return qwen_video.pixel_inputs(processor, frames, resized, device)

    def _video_resized(
        self, num_frames: int, height: int, width: int, processor: Any
    ) -> tuple[int, int]:
        return qwen_video.per_frame_resized(num_frames, height, width, processor)

    def _video_timing(
        self, clip: VideoClip, indices: tuple[int, ...], processor: Any
    ) -> dict[str, Any]:
        """The plan's timing fields for the family (default: none)."""
        return {}

    def _vision_tower_class(self) -> Any:
        raise NotImplementedError


class Qwen2Vl(_QwenVl):
    """Qwen2-VL (``Qwen2VLForConditionalGeneration``)."""

    name = "qwen2_vl"
    title = "Qwen2-VL"
    architectures = ("Qwen2VLForConditionalGeneration",)

    def _vision_tower_class(self) -> Any:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )

        return Qwen2VisionTransformerPretrainedModel


class Qwen2_5Vl(_QwenVl):  # noqa: N801 - the model's own name
    """Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``)."""

    name = "qwen2_5_vl"
    title = "Qwen2.5-VL"
    architectures = ("Qwen2_5_VLForConditionalGeneration",)

    def _video_timing(
        self, clip: VideoClip, indices: tuple[int, ...], processor: Any
    ) -> dict[str, Any]:
        # NOTE: as Qwen2_5_VLProcessor: temporal patch size over the sampled frame rate.
        from transformers.video_utils import VideoMetadata

        sampled = VideoMetadata(
            total_num_frames=clip.num_frames, fps=clip.fps, frames_indices=list(indices)
        )
        return {"seconds_per_temporal_patch": processor.temporal_patch_size / sampled.sampled_fps}

    def _vision_tower_class(self) -> Any:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        return Qwen2_5_VisionTransformerPretrainedModel
