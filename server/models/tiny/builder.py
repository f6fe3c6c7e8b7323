"""What a family's tiny builder tells ``build.build_tiny_model``: the chat template and special
tokens of the tokenizer, the processor configs, the random-weight model, and how to lay the saved
checkpoint out as the hub's."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


def tiny_text_config(
    token_ids: dict[str, int],
    vocab_size: int,
    sizes: TinySizes,
    rope_parameters: dict[str, Any],
) -> dict[str, Any]:
    """The language model's config of a tiny checkpoint: ``sizes``, untied head, the builder's
    special tokens (``<|endoftext|>`` pads and begins, ``<|im_end|>`` ends) and the family's
    rotary settings."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_kv_heads,
        max_position_embeddings=sizes.max_position_embeddings,
        rms_norm_eps=1e-6,
        initializer_range=sizes.init_range,
        tie_word_embeddings=False,
        rope_parameters=rope_parameters,
        bos_token_id=token_ids["<|endoftext|>"],
        eos_token_id=token_ids["<|im_end|>"],
        pad_token_id=token_ids["<|endoftext|>"],
    )


class TinyBuilder(ABC):
    """Builds the tiny checkpoint of one family; instances are stateless and shared."""

    #: the family's name (``ModelFamily.name``, ``epd model tiny --family NAME``)
    name: str
    #: the chat template of a tiny checkpoint (the hub's for the family)
    chat_template: str
    #: special tokens the tokenizer needs beside the shared build's (Qwen's) ones
    special_tokens: tuple[str, ...] = ()
    #: named special tokens of the tokenizer, (attribute, token) pairs the family's processor
    #: reads (InternVL: ``context_image_token`` is ``<IMG_CONTEXT>``)
    named_tokens: tuple[tuple[str, str], ...] = ()

    @abstractmethod
    def save_processor(self, tokenizer: Any, sizes: TinySizes, out: Path) -> None:
        """Write the processor configs (with ``tokenizer`` and ``chat_template``) to ``out``."""

    @abstractmethod
    def model(self, token_ids: dict[str, int], vocab_size: int, sizes: TinySizes) -> Any:
        """A random-weight model (transformers' class for the family, float32, eval mode);
        ``token_ids`` maps special token strings to ids."""

    def finish_checkpoint(self, out: Path) -> None:
        """Rework the checkpoint saved in ``out`` into the hub's layout (default: as
        transformers saved it)."""
        return None
