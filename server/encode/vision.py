"""The vision tower and projector of a model, loaded alone.

Only the vision weights (the family's ``visual_prefixes``) are read from the checkpoint (no
language-model weights in memory), into transformers' own vision model class for the model's
family (``epd.server.models``), on the device asked for. The output is exactly what
the prefill engine consumes (the family's ``image_embeddings``: the merger's output, and for
Qwen3-VL its DeepStack features beside it), [num_tokens, width] per image, with the image's
(t, h, w) grid (LLaVA-1.5: (1, 1, num_tokens)).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from epd.common.errors import InvalidArgument
from epd.server.encode.fast_tower import use_attention, use_patch_embedding
from epd.server.engine.device import CUDA, XPU, resolve_device
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings
from epd.server.media.video_planner import video_processor

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
AUTO = "auto"
PREPROCESS_DEVICES = (AUTO, "cpu")
# the device types a tower runs on besides the CPU, in the order ``auto`` tries them
ACCELERATORS = (CUDA, XPU)
Grid = tuple[int, int, int]


def dtype_for(device: torch.device, dtype: str) -> str:
    """``dtype``, or for ``auto`` bfloat16 on an accelerator and float32 on CPU."""
    if dtype != AUTO:
        return dtype
    return "float32" if device.type == "cpu" else "bfloat16"


def _preprocess_device(processor: Any, device: torch.device, asked: str) -> str | None:
    """The device the processor runs on (None: its own default, the CPU)."""
    if asked not in PREPROCESS_DEVICES:
        raise ValueError(f"preprocess device must be one of {', '.join(PREPROCESS_DEVICES)}")
    if asked == "cpu" or device.type == "cpu":
        return None
    return str(device) if getattr(processor, "backend", None) == "torchvision" else None


def _visual_state_dict(model_dir: Path, family: Any) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    state: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(model_dir / name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                name = family.visual_weight_name(key)
                if name is not None:
                    state[name] = f.get_tensor(key)
    if not state:
        prefixes = ", ".join(family.visual_prefixes)
        raise ValueError(f"no vision tower weights ({prefixes}) in {model_dir}")
    return state


@dataclass(frozen=True, slots=True)
class Prepared:
    """Images made ready for the tower: their pixel inputs (``ModelFamily.pixel_inputs``), on
    the device that made them, and their grids [num_images, 3] (one image, or a video chunk's
    frames, as the worker prepares them one by one; several, from ``preprocess``)."""

    pixel_values: Any
    grid: torch.Tensor


class VisionEncoder:
    """Preprocess images and run the vision tower on a batch of them."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str = AUTO,
        preprocess_device: str = AUTO,
        attention: str = AUTO,
        patch_embedding: str = AUTO,
    ) -> None:
        """``preprocess_device``: where the image processor runs: ``auto`` (the tower's device
        where the processor can run there: transformers' torchvision backend; else CPU) or
        ``cpu``. ``attention`` and ``patch_embedding``: how the tower runs (``fast_tower``;
        auto: packed attention and the patch embedding as a matrix product on an accelerator,
        transformers' own on CPU)."""
        from transformers import AutoConfig, AutoImageProcessor

        from epd.server.models.registry import family_of

        if dtype != AUTO and dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}")
        self.model_dir = Path(model_dir)
        family = family_of(self.model_dir)
        self.device = torch.device(resolve_device(device, accelerators=ACCELERATORS))
        self.dtype = DTYPES[dtype_for(self.device, dtype)]
        if self.device.type == "cuda" and self.dtype == torch.float32:
            # NOTE: cuDNN convolutions (the patch embedding) default to TF32 on Ampere and later,
            # which moves embeddings by ~1e-2 relative; float32 asked means float32 computed.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        config = AutoConfig.from_pretrained(self.model_dir)
        vision_config = config.vision_config
        from transformers.initialization import no_init_weights

        # NOTE: built on the target device without random init; the checkpoint fills every weight.
        with no_init_weights(), torch.device(self.device):
            model = family.vision_tower(config)
        model.load_state_dict(_visual_state_dict(self.model_dir, family), strict=True)
        self.model = model.to(dtype=self.dtype).eval()
        on_accelerator = self.device.type != "cpu"
        self.attention = use_attention(self.model, attention, family.packs_images, on_accelerator)
        self.num_fast_convolutions = use_patch_embedding(
            self.model, patch_embedding, on_accelerator
        )
        self.family = family
        self.processor: Any = AutoImageProcessor.from_pretrained(self.model_dir)
        self.preprocess_device = _preprocess_device(self.processor, self.device, preprocess_device)
        self.video_processor: Any = video_processor(self.model_dir)
        self.config = config
        self.merge_size = family.merge_size(config)
        self.hidden_size = int(vision_config.hidden_size)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        logger.info(
            "vision tower of %s on %s (%s, %d parameters, %s attention)",
            self.model_dir.name,
            self.device,
            str(self.dtype).removeprefix("torch."),
            self.num_parameters,
            self.attention,
        )

    def preprocess(self, images: list[Any]) -> tuple[Any, torch.Tensor]:
        """Pixel inputs of all ``images`` (Pillow images or uint8 [3, height, width] tensors) in
        one call of the model's processor, and their grids [num_images, 3]."""
        return self.family.pixel_inputs(
            self.processor, images, self.config, device=self.preprocess_device
        )

    def prepare(
        self, pixels: torch.Tensor, settings: ImageSettings = NO_IMAGE_SETTINGS
    ) -> Prepared:
        """The pixel inputs of one image given as its RGB pixels (uint8 [height, width, 3], a
        view is enough: they are read before this returns), made by the model's processor on
        ``preprocess_device`` within ``settings`` (none: the model's own); thread-safe, so
        images are prepared in parallel, apart from the tower."""
        processor = self.family.image_processor_within(self.processor, settings.settings)
        pixel_values, grid = self.family.pixel_inputs(
            processor, [pixels.permute(2, 0, 1)], self.config, device=self.preprocess_device
        )
        return Prepared(pixel_values, grid)

    def prepare_video(self, frames: torch.Tensor, resized: tuple[int, int]) -> Prepared:
        """The pixel inputs of a run of a video's kept frames (uint8 [n, height, width, 3], cut
        at temporal-patch boundaries) resized to ``resized`` (height, width), made by the
        model's video processor (``ModelFamily.video_pixel_inputs``); thread-safe like
        ``prepare``. The tower takes them as it takes an image's: a grid of t > 1."""
        if self.video_processor is None:
            refusal = self.family.refuse_video()
            raise InvalidArgument(str(refusal), reason=refusal.reason)
        pixel_values, grid = self.family.video_pixel_inputs(
            self.video_processor, frames, resized, self.preprocess_device, self.config
        )
        return Prepared(pixel_values, grid)

    @torch.inference_mode()
    def run(self, prepared: list[Prepared]) -> list[tuple[torch.Tensor, Grid]]:
        """Embeddings [num_tokens, hidden] and grid of each image of ``prepared``, in one tower
        call. Returns once an accelerator has computed them, so the calling thread (the
        tower's own) is the one that waits, never the event loop that hands the embeddings
        over, and a batch's time is what the device took. The embeddings stay on the encoder's
        device: the data plane hands them over from there (device to device over NIXL, or
        staged to host memory once)."""
        if len(prepared) == 1:
            pixel_values, grid = prepared[0].pixel_values, prepared[0].grid
        else:
            pixel_values, grid = self.family.join_pixel_inputs(
                [(p.pixel_values, p.grid) for p in prepared]
            )
        merged = self.family.image_embeddings(
            self.model, pixel_values.to(self.device, self.dtype), grid.to(self.device)
        )
        sizes = (grid.prod(-1) // self.merge_size**2).tolist()
        chunks = torch.split(merged, sizes)
        results = [
            (chunk.contiguous(), (int(t), int(h), int(w)))
            for chunk, (t, h, w) in zip(chunks, grid.tolist(), strict=True)
        ]
        if self.device.type != "cpu":
            getattr(torch, self.device.type).synchronize(self.device)
        return results

    @torch.inference_mode()
    def encode(self, images: list[Any]) -> list[tuple[torch.Tensor, Grid]]:
        """Embeddings [num_tokens, hidden] and grid of each image, preprocessed together
        (``preprocess``), in one tower call (``run``)."""
        return self.run([Prepared(*self.preprocess(images))])
