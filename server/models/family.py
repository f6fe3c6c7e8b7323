"""What a model family tells the services that serve it.

A family covers checkpoints of one architecture (``config.json`` ``architectures``). Services
ask it for what differs between families: the vision tower to load alone and the checkpoint
prefixes of its weights, what running it gives (the embeddings handed to the language model, and
their width), how those embeddings enter the language model in the transformers engine, the resize
rule that turns an image's size into its patch grid (no pixel work), and, for ``epd model tiny``,
how to build a random-weight checkpoint laid out like the hub's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Grid = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class TinySizes:
    """Sizes of a tiny random-weight checkpoint (head dims stay 64: vLLM's CPU attention)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vision_depth: int
    vision_embed_dim: int
    vision_num_heads: int
    min_pixels: int
    max_pixels: int
    init_range: float
    max_position_embeddings: int = 4096


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
    #: the chat template of a tiny checkpoint (None: the builder's Qwen2-VL template)
    chat_template: str | None = None

    @abstractmethod
    def vision_tower(self, vision_config: Any) -> Any:
        """The vision tower + projector module for ``vision_config`` (a ``torch.nn.Module``
        built with transformers' own class; weights are loaded by the caller). Its output, per
        batch, is exactly what the language model consumes."""

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

    @abstractmethod
    def resized(
        self, width: int, height: int, factor: int, min_pixels: int, max_pixels: int
    ) -> tuple[int, int]:
        """(height, width) the family's image processor resizes a ``width`` x ``height`` image
        to; ValueError if it cannot take it."""

    @abstractmethod
    def save_tiny_processor(
        self, tokenizer: Any, sizes: TinySizes, chat_template: str, out: Path
    ) -> None:
        """Write the processor configs of a tiny checkpoint to ``out``."""

    @abstractmethod
    def tiny_model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        """A random-weight model (transformers' class for the family, float32, eval mode);
        ``token_ids`` maps special token strings to ids."""
