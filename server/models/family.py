"""What a model family tells the services that serve it.

A family covers checkpoints of one architecture (``config.json`` ``architectures``). Services
ask it for what differs between families: the vision tower to load alone and the checkpoint
prefixes of its weights, what running it gives (the embeddings handed to the language model, and
their width), the prompt's placeholder scheme (an optional start token, then one image token per
image that engines expand to the image's rows), how those embeddings enter vLLM and the language
model in the transformers engine (with which positions), and the rule that turns an image's size
into its grid (no pixel work). How to build a tiny random-weight checkpoint of a family, for
``epd model tiny``, is the family's builder's (``tiny/``), which serving never imports.

Grids are (t, h, w) in patches, and an image takes t x h x w / ``merge_size`` ** 2 rows.
Families without a patch grid (LLaVA-1.5: a fixed number of rows per image, 1-D positions) say
(1, 1, rows) with a merge size of 1, so grids travel in the same proto field for every family.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from epd.server.models.video import Grid as Grid
from epd.server.models.video import VideoClip, VideoPlan, VideoRefused

#: the key of an image's row count in ``separately_batched_items``
ROWS_KEY = "image_num_rows"


def separately_batched_items(embeddings: list[Any]) -> list[dict[str, Any]]:
    """vLLM items of one ``image_embeds`` [rows, hidden] per image (a batched field), as vLLM's
    renderer makes them, and the image's row count as a shared field (``ROWS_KEY``, which vLLM's
    model ignores). vLLM batches consecutive items only where their shared fields are equal, so
    images of different row counts are never batched: the embeddings schemas of vLLM 0.32's
    LLaVA-OneVision and InternVL refuse such a batch, and the EngineCore dies."""
    import torch
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFieldElem,
        MultiModalSharedField,
    )

    batched, shared = MultiModalBatchedField(), MultiModalSharedField(batch_size=1)
    return [
        {
            "image_embeds": MultiModalFieldElem(embeds, batched),
            ROWS_KEY: MultiModalFieldElem(torch.tensor([embeds.shape[0]]), shared),
        }
        for embeds in embeddings
    ]


def image_size(image: Any) -> tuple[int, int]:
    """(width, height) of a Pillow image or of a [3, height, width] tensor."""
    if hasattr(image, "width"):
        return int(image.width), int(image.height)
    return int(image.shape[-1]), int(image.shape[-2])


class ModelFamily(ABC):
    """One architecture family; instances are stateless and shared."""

    #: identifier used on the command line (``epd model tiny --family NAME``)
    name: str
    #: the name users know (support table, messages)
    title: str
    #: ``config.json`` ``architectures`` entries this family serves
    architectures: tuple[str, ...]
    #: checkpoint key prefixes of the vision tower + projector weights (hub and transformers 5)
    visual_prefixes: tuple[str, ...]
    #: the longest side over the shortest the resize rule takes (None: any)
    max_aspect_ratio: int | None = None
    #: whether the vision tower packs a batch's images into one sequence and attends within
    #: each by sequence bounds (``cu_seqlens``): the encoder's packed attention applies
    packs_images: bool = False

    @abstractmethod
    def vision_tower(self, config: Any) -> Any:
        """The vision tower + projector module for a model's transformers ``config`` (a
        ``torch.nn.Module`` built with transformers' own classes; weights are loaded by the
        caller, named as ``visual_weight_name`` gives). ``image_embeddings`` runs it."""

    def visual_weight_name(self, key: str) -> str | None:
        """The name in ``vision_tower``'s module of checkpoint weight ``key``, None if it is no
        vision weight (default: ``key`` less the first of ``visual_prefixes`` it starts with)."""
        prefix = next((p for p in self.visual_prefixes if key.startswith(p)), None)
        return None if prefix is None else key[len(prefix) :]

    def model_tower(self, model: Any) -> Any:
        """The vision tower + projector inside a loaded transformers ``model``, for
        ``image_embeddings`` (default: ``model.model.visual``)."""
        return model.model.visual

    def placeholder_start_id(self, config: Any) -> int | None:
        """The token that opens each image's placeholder (the image token follows it), None if
        the image token stands alone."""
        return None

    def image_delimiters(
        self, config: Any, tokenizer: Any
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The tokens engines put before and after an image's rows when they expand its
        placeholder (InternVL: ``<img>`` and ``</img>`` around the ``<IMG_CONTEXT>`` rows), read
        from ``config`` or the checkpoint's ``tokenizer`` (default: none)."""
        return (), ()

    def merge_size(self, config: Any) -> int:
        """Grid cells per embedding row along each side (rows = t x h x w / merge_size**2)."""
        return 1

    def pixel_inputs(
        self, processor: Any, images: list[Any], config: Any, device: str | None = None
    ) -> tuple[Any, Any]:
        """``processor`` (the checkpoint's image processor) on ``images`` (Pillow images or uint8
        [3, height, width] tensors), on ``device`` (None: the processor's default): the pixel
        values the tower takes and the grids [num_images, 3] (default: the processor's
        ``image_grid_thw``). Callers only move the pixel values (``.to(device, dtype)``) and
        hand them to ``image_embeddings``: a family whose tower needs more than pixels gives a
        ``BatchFeature`` (LLaVA-OneVision: its pixel values and image sizes)."""
        inputs = processor(images=images, return_tensors="pt", device=device)
        return inputs["pixel_values"], inputs["image_grid_thw"]

    def join_pixel_inputs(self, parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        """``pixel_inputs`` of images made one at a time, joined into what ``image_embeddings``
        takes for all of them in one call (default: pixel values and grids concatenated)."""
        import torch

        return torch.cat([pixels for pixels, _ in parts]), torch.cat([grid for _, grid in parts])

    def embedding_width(self, config: Any) -> int:
        """Width of an image's embedding rows as encoders hand them over and engines take them,
        for a model's transformers ``config``: the text model's hidden size unless the family
        carries more per row."""
        return int(config.get_text_config().hidden_size)

    def image_embeddings(self, tower: Any, pixel_values: Any, grid: Any) -> Any:
        """Run ``tower`` (``vision_tower``'s module, or a loaded model's own) on a batch of pixel
        patches with their grids [num_images, 3]: the embeddings of all images, concatenated,
        [num_tokens, ``embedding_width``], exactly what vLLM takes as ``image_embeds``."""
        output = tower(pixel_values, grid_thw=grid)
        return output.pooler_output if hasattr(output, "pooler_output") else output

    def language_model_inputs(
        self, inputs_embeds: Any, is_image: Any, embeddings: Any
    ) -> tuple[Any, dict[str, Any]]:
        """For the transformers engine's prefill: ``inputs_embeds`` [1, length, hidden] with
        ``embeddings`` (all images', concatenated) in the rows ``is_image`` [1, length] marks,
        and the extra keyword arguments the language model's forward takes with them."""
        rows = embeddings.to(inputs_embeds.device, inputs_embeds.dtype)
        return inputs_embeds.masked_scatter(is_image.unsqueeze(-1), rows), {}

    def positions(
        self, model: Any, ids: Any, is_image: Any, grids: Any, videos: Any = None
    ) -> tuple[Any, int]:
        """The transformers engine's prefill position ids for ``ids`` [1, length] (images at
        ``is_image``, their grids [num_images, 3]; ``videos``: None, or (is_video, their grids
        [num_videos, 3], their seconds per temporal patch [num_videos])) and the offset of
        later positions from the cache length (default: 1-D positions 0..length-1, offset 0)."""
        import torch

        return torch.arange(ids.shape[1], device=ids.device).unsqueeze(0), 0

    def decode_positions(self, position: int, device: Any) -> Any:
        """Position ids of one decoded token at ``position`` (default: 1-D, [1, 1])."""
        import torch

        return torch.full((1, 1), position, device=device)

    @abstractmethod
    def image_grid(self, width: int, height: int, config: Any, processor: Any) -> Grid:
        """The grid ``processor`` (the checkpoint's image processor; ``config`` its model
        config) gives a ``width`` x ``height`` image, from the size alone; ValueError if it
        cannot take it."""

    def image_pixel_budget(self, processor: Any, given: dict[str, int]) -> dict[str, int]:
        """The whole pixel budget (``min_pixels`` and ``max_pixels``) ``processor`` (the
        checkpoint's image processor) resizes images within once ``given`` (some of them, as a
        request's ``mm_processor_kwargs`` set them) replaces its own; {} for none given.
        ValueError (default) when it resizes to a fixed size instead."""
        if given:
            raise ValueError(
                f"{self.title} image processors resize to a fixed size, not within a pixel "
                "budget: min_pixels, max_pixels and size do not apply"
            )
        return {}

    def image_processor_within(self, processor: Any, budget: dict[str, int]) -> Any:
        """``processor`` (shared: left as it is), or a copy of it that resizes within
        ``budget`` (a whole ``image_pixel_budget``; {}: its own), as the same
        ``mm_processor_kwargs`` change it for one call of vLLM's processor."""
        self.image_pixel_budget(processor, budget)
        return processor

    def plan_video(self, clip: VideoClip, config: Any, processor: Any) -> VideoPlan:
        """The ``VideoPlan`` ``processor`` (the checkpoint's video processor; ``config`` its
        model config) makes of ``clip``: frames kept, size, grid, token count, timing, from the
        clip's sizes alone; ``VideoRefused`` if it cannot take the clip (default: the family
        takes no video)."""
        raise self.refuse_video()

    def video_pixel_inputs(
        self,
        processor: Any,
        frames: Any,
        resized: tuple[int, int],
        device: str | None = None,
        config: Any = None,
    ) -> tuple[Any, Any]:
        """``processor`` (the checkpoint's video processor; ``config`` its model config, which
        LLaVA-OneVision needs for the grid) on ``frames`` (uint8 [n, height, width, 3]: a plan's
        kept frames, or a run of them cut at temporal patch boundaries), each resized to
        ``resized`` (the plan's (height, width)), on ``device``: the pixel values the tower
        takes and the grid [1, 3]. Runs cut at temporal patch boundaries give, joined, the pixel
        values of the whole clip (default: the family takes no video)."""
        raise self.refuse_video()

    def video_language_rows(self, model: Any, rows: Any) -> Any:
        """For the transformers engine's prefill: a video's rows as the language model takes
        them, from its chunks' joined rows and the loaded ``model`` (LLaVA-OneVision: the
        ``image_newline`` row after the last frame; default: the rows themselves)."""
        return rows

    def vllm_video_data(
        self,
        embeddings: list[Any],
        grids: list[Grid],
        seconds_per_temporal_patch: list[float],
        timestamps: list[tuple[float, ...]],
    ) -> Any:
        """vLLM's precomputed input of videos (``multi_modal_data["video"]``): each video's
        embeddings [rows, width], grid (t, h, w), seconds per temporal patch (0.0: the family
        has none) and time of each temporal patch (empty: the family shows none) (default: the
        family takes no video)."""
        raise self.refuse_video()

    def video_prompt_tokens(
        self, grid: Grid, timestamps: tuple[float, ...], config: Any, tokenizer: Any
    ) -> list[int] | None:
        """What a video's one video token expands to in the prompt where the family writes
        more than the video's rows (Qwen3-VL: each temporal patch's time as text), as engines
        expand it: the one source of the route's expanded prompt and block hashes, the engines'
        length check and the transformers engine's expansion; None (default): the rows alone."""
        return None

    def refuse_video(self) -> VideoRefused:
        """The refusal of a video by a family that takes none, naming the family."""
        return VideoRefused(f"{self.title} models do not take video", "VIDEO_NOT_SUPPORTED")

    def vllm_items(self, embeddings: list[Any], grids: list[Grid]) -> list[dict[str, Any]] | None:
        """None (default): vLLM's renderer makes the engine's items of ``vllm_data``. A family
        whose items the renderer makes wrongly gives them itself: one per image
        (``MultiModalFieldElem`` per field), as the renderer makes them of ``vllm_data`` (a test
        compares them), with keys of its own that vLLM's model ignores (``ROWS_KEY``)."""
        return None

    @abstractmethod
    def vllm_data(self, embeddings: list[Any], grids: list[Grid]) -> Any:
        """vLLM's public ``multi_modal_data["image"]`` for images given as embeddings (Qwen
        families: a dict of ``image_embeds`` and ``image_grid_thw``; LLaVA: a tensor)."""


class SeparatelyBatchedFamily(ModelFamily):
    """A family whose images enter vLLM as one ``image_embeds`` [rows, hidden] tensor each, in
    items of their own (``separately_batched_items``), so that images of different row counts
    (InternVL's tile counts, LLaVA-OneVision's sizes) are never batched together."""

    def vllm_items(self, embeddings: list[Any], grids: list[Grid]) -> list[dict[str, Any]]:
        return separately_batched_items(embeddings)

    def vllm_data(self, embeddings: list[Any], grids: list[Grid]) -> Any:
        # NOTE: vLLM's parser takes a list of [rows, hidden] tensors as the image data itself.
        return list(embeddings)
