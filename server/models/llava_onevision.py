"""LLaVA-OneVision: a SigLIP vision tower read at ``vision_feature_layer`` (-1, all patches:
``vision_feature_select_strategy`` 'full'), ``multi_modal_projector``, and anyres tiling. The
image processor resizes the whole image to the tower's square (the base tile) and, for the pinpoint
resolution (``image_grid_pinpoints``) that fits the image best, cuts the resized and padded image
into tiles of that square. An image's rows, as the language model takes them, are the base tile's
patches, then the tiles' patches as one grid with the padding cut off (bilinearly shrunk when it
holds over 1.1 x the rows of ``vision_aspect_ratio``'s tiles, 'anyres_max_9': 9), each grid row
closed by the ``image_newline`` row. The chat template emits ``<image>`` once per image and
engines expand it to those rows; positions are 1-D.

No patch grid travels: the number of rows follows from the image's size alone (transformers'
``LlavaOnevisionProcessor._get_number_of_features``, vLLM's ``get_num_image_tokens``), so the grid
is (1, 1, rows) with a merge size of 1, as for LLaVA-1.5. Packing the tiles needs the image's size
beside its pixels: ``pixel_inputs`` hands the processor's ``BatchFeature`` of ``pixel_values``
[images, tiles, 3, side, side] (tiles padded to the batch's most) and ``image_sizes`` [images, 2]
(height, width) to ``image_embeddings``, which gives the packed rows, what vLLM takes as
``image_embeds`` (one [rows, hidden] tensor per image, a batched field).

Every image is tiled, however many a prompt holds, as vLLM 0.32 tiles them and as transformers'
processor does given one flat list of images (given a list per text, it shows the images of a
text that holds several untiled: the base tile and one newline row). vLLM 0.32's embeddings
schema refuses a batch of images of different row counts, so ``vllm_items`` keeps them apart
(``family.SeparatelyBatchedFamily``).

Hub checkpoints name the tower's weights ``vision_tower.vision_model.*``, the projector's
``multi_modal_projector.*``, the newline row ``image_newline`` and the language model's
``language_model.*`` (the tiny builder, ``tiny/llava_onevision.py``, saves them so too).

Video (``onevision_video``): each frame through the tower, projected and pooled 2 x 2, a grid
of (frames, pooled side, pooled side); an encoder batch may join video chunks and images, told
apart by their grids; the transformers engine appends the video's newline row. vLLM 0.32 takes
no OneVision video embeddings, so ``vllm_video_data`` refuses.
"""

from __future__ import annotations

import math
from typing import Any

from epd.server.models import onevision_video
from epd.server.models.family import (
    Grid,
    SeparatelyBatchedFamily,
    image_size,
)
from epd.server.models.projected_tower import projected_tower
from epd.server.models.video import VideoClip, VideoPlan, VideoRefused


class LlavaOnevision(SeparatelyBatchedFamily):
    """LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``, SigLIP tower, anyres)."""

    name = "llava_onevision"
    title = "LLaVA-OneVision"
    architectures = ("LlavaOnevisionForConditionalGeneration",)
    visual_prefixes = (
        "vision_tower.",
        "multi_modal_projector.",
        "image_newline",
        "model.vision_tower.",
        "model.multi_modal_projector.",
        "model.image_newline",
    )

    def vision_tower(self, config: Any) -> Any:
        import torch
        from torch import nn
        from transformers import AutoModel
        from transformers.models.llava_onevision.modeling_llava_onevision import (
            LlavaOnevisionMultiModalProjector,
        )

        tower = projected_tower(
            config,
            AutoModel.from_config(config.vision_config),
            LlavaOnevisionMultiModalProjector(config),
        )
        tower.image_newline = nn.Parameter(torch.empty(config.text_config.hidden_size))
        return tower

    def visual_weight_name(self, key: str) -> str | None:
        name = key.removeprefix("model.")
        if name.startswith("vision_tower."):
            return "vision_tower." + name.removeprefix("vision_tower.").removeprefix(
                "vision_model."
            )
        if name.startswith("multi_modal_projector.") or name == "image_newline":
            return name
        return None

    def model_tower(self, model: Any) -> Any:
        return model.model

    def pixel_inputs(
        self, processor: Any, images: list[Any], config: Any, device: str | None = None
    ) -> tuple[Any, Any]:
        import torch
        from transformers import BatchFeature

        inputs = processor(images=images, return_tensors="pt", device=device)
        pixels = BatchFeature({key: inputs[key] for key in ("pixel_values", "image_sizes")})
        grids = [self.image_grid(*image_size(image), config, processor) for image in images]
        return pixels, torch.tensor(grids)

    def join_pixel_inputs(self, parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        """Each image's tiles padded with zero tiles to the most any has, as the processor pads
        a batch (``image_embeddings`` reads each image's own tiles only); video chunks' frames
        concatenated beside them (``onevision_video.VIDEO_PIXELS_KEY``), the grids in the
        parts' order."""
        import torch
        from transformers import BatchFeature

        key = onevision_video.VIDEO_PIXELS_KEY
        videos = [pixels[key] for pixels, _ in parts if key in pixels]
        pictures = [(pixels, grid) for pixels, grid in parts if key not in pixels]
        joined = self._join_pictures(pictures) if pictures else {}
        if videos:
            joined[key] = torch.cat(videos)
        return BatchFeature(joined), torch.cat([grid for _, grid in parts])

    def _join_pictures(self, parts: list[tuple[Any, Any]]) -> dict[str, Any]:
        import torch

        tiles = [pixels["pixel_values"] for pixels, _ in parts]
        most = max(int(image.shape[1]) for image in tiles)
        padded = [
            torch.nn.functional.pad(image, (0, 0, 0, 0, 0, 0, 0, most - image.shape[1]))
            for image in tiles
        ]
        sizes = torch.cat([pixels["image_sizes"] for pixels, _ in parts])
        return {"pixel_values": torch.cat(padded), "image_sizes": sizes}

    def image_embeddings(self, tower: Any, pixel_values: Any, grid: Any) -> Any:
        """As transformers' ``LlavaOnevisionModel.get_image_features`` (every image tiled) and
        ``get_video_features`` (less the video's newline row, which the engine appends):
        ``pixel_values`` is ``pixel_inputs``' or ``video_pixel_inputs``' ``BatchFeature``, or
        their join; the rows of each item in ``grid``'s order [rows of all, hidden]."""
        import torch

        key = onevision_video.VIDEO_PIXELS_KEY
        if key not in pixel_values:
            return self._picture_rows(tower, pixel_values)
        is_video = [onevision_video.is_video_grid(item) for item in grid.tolist()]
        sizes = [int(rows) for rows in grid.prod(-1).tolist()]
        videos = iter(
            torch.split(
                onevision_video.frame_rows(tower, pixel_values[key]),
                [n for n, video in zip(sizes, is_video, strict=True) if video],
            )
        )
        pictures = iter(
            torch.split(
                # NOTE: a batch of video chunks alone has no picture rows to split
                self._picture_rows(tower, pixel_values) if not all(is_video) else grid[:0],
                [n for n, video in zip(sizes, is_video, strict=True) if not video],
            )
        )
        return torch.cat([next(videos) if video else next(pictures) for video in is_video])

    def _picture_rows(self, tower: Any, pixel_values: Any) -> Any:
        """The packed rows of the images in ``pixel_values`` (tiles and image sizes)."""
        import torch
        from transformers.models.llava_onevision.modeling_llava_onevision import (
            LlavaOnevisionModel,
            image_size_to_num_patches,
        )

        config = tower.config
        pixels, image_sizes = pixel_values["pixel_values"], pixel_values["image_sizes"]
        num_tiles = [
            image_size_to_num_patches(
                size, config.image_grid_pinpoints, config.vision_config.image_size
            )
            for size in image_sizes
        ]
        tiles = torch.cat([image[:count] for image, count in zip(pixels, num_tiles, strict=True)])
        layers = config.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else list(layers)
        hidden = tower.vision_tower(tiles, output_hidden_states=True).hidden_states
        chosen = torch.cat([hidden[layer] for layer in layers], dim=-1)
        if config.vision_feature_select_strategy == "default":
            chosen = chosen[:, 1:]
        features = torch.split(tower.multi_modal_projector(chosen), num_tiles)
        packed, _ = LlavaOnevisionModel.pack_image_features(
            tower,
            features,
            image_sizes,
            image_newline=tower.image_newline,
            vision_aspect_ratio=config.vision_aspect_ratio,
        )
        return torch.cat(packed)

    def image_grid(self, width: int, height: int, config: Any, processor: Any) -> Grid:
        return 1, 1, num_image_rows(width, height, config, processor.image_grid_pinpoints)

    def plan_video(self, clip: VideoClip, config: Any, processor: Any) -> VideoPlan:
        return onevision_video.plan(clip, config, processor)

    def video_pixel_inputs(
        self,
        processor: Any,
        frames: Any,
        resized: tuple[int, int],
        device: str | None = None,
        config: Any = None,
    ) -> tuple[Any, Any]:
        if config is None:
            raise ValueError("LLaVA-OneVision's video grid needs the model config")
        side = onevision_video.pooled_side(config)
        return onevision_video.pixel_inputs(processor, frames, resized, side, device)

    def video_prompt_tokens(
        self, grid: Grid, timestamps: tuple[float, ...], config: Any, tokenizer: Any
    ) -> list[int] | None:
        """The video's rows and its newline row, each a video token."""
        return [int(config.video_token_id)] * (grid[0] * grid[1] * grid[2] + 1)

    def video_language_rows(self, model: Any, rows: Any) -> Any:
        return onevision_video.with_newline(model, rows)

    def vllm_video_data(
        self,
        embeddings: list[Any],
        grids: list[Grid],
        seconds_per_temporal_patch: list[float],
        timestamps: list[tuple[float, ...]],
    ) -> Any:
        # NOTE: vLLM 0.32's LLaVA-OneVision takes a video as pixels only
        # (LlavaOnevisionVideoPixelInputs; _parse_and_validate_video_input reads
        # pixel_values_videos alone), never as embeddings.
        raise VideoRefused(
            "LLaVA-OneVision takes video embeddings on the transformers engine only: vLLM's "
            "model takes a video as frames, on an encode_prefill worker (EPD)",
            "VIDEO_NOT_SUPPORTED",
        )


def num_image_rows(width: int, height: int, config: Any, pinpoints: list[list[int]]) -> int:
    """Rows of a ``width`` x ``height`` image: the base tile's, then the unpadded tiles' (shrunk
    past the aspect ratio's bound) with a newline row each, as transformers' processor and vLLM
    count them."""
    from transformers.image_processing_utils import select_best_resolution

    tile = int(config.vision_config.image_size)
    side = tile // int(config.vision_config.patch_size)
    best_height, best_width = (int(v) for v in select_best_resolution([height, width], pinpoints))
    rows_high, rows_wide = side * (best_height // tile), side * (best_width // tile)
    if width / height > rows_wide / rows_high:
        kept = int(round(height * (rows_wide / width), 7))
        rows_high -= 2 * ((rows_high - kept) // 2)
    else:
        kept = int(round(width * (rows_high / height), 7))
        rows_wide -= 2 * ((rows_wide - kept) // 2)
    max_tiles = int(str(config.vision_aspect_ratio).removeprefix("anyres_max_"))
    ratio = math.sqrt(rows_high * rows_wide / (max_tiles * side**2))
    if ratio > 1.1:
        rows_high, rows_wide = int(rows_high // ratio), int(rows_wide // ratio)
    rows = side * side + rows_high * rows_wide + rows_high
    return rows - int(config.vision_feature_select_strategy == "default")
