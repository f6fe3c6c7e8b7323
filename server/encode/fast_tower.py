"""Faster execution of a loaded vision tower, with the same outputs.

Two rewrites, both of what transformers' modules compute, not of the model:

- A convolution whose every input is exactly one kernel large (the patch embedding of Qwen's
  towers: ``Conv3d`` with kernel = stride over inputs reshaped to one patch each) is a matrix
  product of each flattened patch with the flattened kernel: run as one ``linear``, which is what
  vLLM does for the same layer; oneDNN's and cuDNN's 3-D convolutions are several times slower
  on such shapes.
- Towers that pack the images of a batch into one sequence and attend within each image (or
  window) by ``cu_seqlens`` call transformers' attention once per image or window with SDPA
  (a Python loop of hundreds of small calls for windowed towers). ``packed_attention`` takes the
  packed form instead and runs one SDPA call per run of equally long consecutive sequences
  (the images of one size in a batch, the full windows of an image), viewing them as a batch
  without copying.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn

# NOTE: transformers' towers take their packed (varlen) branch only for an attention
# implementation whose name contains "flash"; this one computes exactly SDPA's result.
PACKED_ATTENTION = "epd_packed_flash_sdpa"
ATTENTIONS = ("auto", "packed", "sdpa", "eager")
PATCH_EMBEDDINGS = ("auto", "matmul", "conv")


class KernelSizedConv(nn.Module):
    """A convolution run as a matrix product on inputs exactly one kernel large (no padding,
    dilation or groups); other inputs go through the convolution itself."""

    def __init__(self, conv: nn.Conv2d | nn.Conv3d) -> None:
        super().__init__()
        self.conv = conv

    @property
    def weight(self) -> torch.Tensor:
        """The convolution's weight (the towers read its dtype)."""
        return self.conv.weight

    @property
    def bias(self) -> torch.Tensor | None:
        """The convolution's bias."""
        return self.conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = tuple(self.conv.kernel_size)
        if tuple(x.shape[2:]) != kernel:
            return self.conv(x)  # type: ignore[no-any-return]
        out = F.linear(x.flatten(1), self.conv.weight.flatten(1), self.conv.bias)
        return out.view(*out.shape, *([1] * len(kernel)))


def is_kernel_sized(conv: nn.Module) -> bool:
    """Whether ``conv`` is a plain convolution with stride equal to its kernel (a patch
    embedding), which ``KernelSizedConv`` can run."""
    return (
        isinstance(conv, nn.Conv2d | nn.Conv3d)
        and tuple(conv.stride) == tuple(conv.kernel_size)
        and all(p == 0 for p in conv.padding)  # type: ignore[union-attr]
        and all(d == 1 for d in conv.dilation)
        and conv.groups == 1
    )


def speed_up_patch_embeddings(model: nn.Module) -> int:
    """Wrap every kernel-sized convolution of ``model`` in ``KernelSizedConv``; returns how
    many. Call after the weights are loaded (the wrapped modules' names change)."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if is_kernel_sized(child)
    ]
    for parent, name, child in targets:
        setattr(parent, name, KernelSizedConv(child))  # type: ignore[arg-type]
    return len(targets)


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each sequence of a packed batch: ``query``, ``key``, ``value``
    [1, heads, total, head_dim], sequence bounds ``cu_seq_lens_q``; [1, total, heads, head_dim]
    as transformers' attention functions return it. Without bounds: one SDPA call over the
    batch as given."""
    if cu_seq_lens_q is None:
        output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling
        )
        return output.transpose(1, 2), None
    heads, head_dim = query.shape[1], query.shape[3]
    output = torch.empty_like(query[0])
    for start, count, length in runs_of(cu_seq_lens_q):
        end = start + count * length
        shape = (heads, count, length, head_dim)
        q, k, v = (t[0, :, start:end].view(shape).transpose(0, 1) for t in (query, key, value))
        run = F.scaled_dot_product_attention(q, k, v, scale=scaling)
        output[:, start:end] = run.transpose(0, 1).reshape(heads, end - start, head_dim)
    return output.transpose(0, 1).unsqueeze(0), None


def equal_runs(bounds: list[int]) -> list[tuple[int, int, int]]:
    """(start, number of sequences, length) of each run of consecutive equally long sequences
    between ``bounds`` (cumulative, from 0); empty sequences are skipped."""
    runs: list[tuple[int, int, int]] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        length = end - start
        if not length:
            continue
        if runs and runs[-1][2] == length and runs[-1][0] + runs[-1][1] * length == start:
            first, count, _ = runs[-1]
            runs[-1] = (first, count + 1, length)
        else:
            runs.append((start, 1, length))
    return runs


_RUNS_SEEN: dict[int, tuple[weakref.ref[torch.Tensor], list[tuple[int, int, int]]]] = {}


def runs_of(bounds: torch.Tensor) -> list[tuple[int, int, int]]:
    """``equal_runs`` of a bounds tensor, read from the device once per tensor: every layer of
    a tower gets the same bounds, and reading them back on CUDA waits for the GPU to catch up,
    leaving it idle while the next layer's kernels are launched. Bounds are never changed in
    place (inference tensors, which they are when serving, cannot even say whether they were)."""
    key = id(bounds)
    seen = _RUNS_SEEN.get(key)
    if seen is not None and seen[0]() is bounds:
        return seen[1]
    runs = equal_runs(bounds.tolist())
    if len(_RUNS_SEEN) >= 8:
        _RUNS_SEEN.clear()
    _RUNS_SEEN[key] = (weakref.ref(bounds), runs)
    return runs


def register_packed_attention() -> None:
    """Make ``PACKED_ATTENTION`` an attention implementation transformers knows."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)


def use_patch_embedding(model: nn.Module, patch_embedding: str, on_accelerator: bool) -> int:
    """Run ``model``'s kernel-sized convolutions as ``patch_embedding`` (``PATCH_EMBEDDINGS``;
    ``auto``: as matrix products on an accelerator, as convolutions on CPU, where the two
    measured alike and the convolution is transformers' own, bit for bit); returns how many
    run as matrix products."""
    if patch_embedding not in PATCH_EMBEDDINGS:
        raise ValueError(f"patch embedding must be one of {', '.join(PATCH_EMBEDDINGS)}")
    if patch_embedding == "conv" or (patch_embedding == "auto" and not on_accelerator):
        return 0
    return speed_up_patch_embeddings(model)


def use_attention(model: Any, attention: str, packs_images: bool, on_accelerator: bool) -> str:
    """Set the attention implementation of ``model`` (a transformers model) for ``attention``
    (``ATTENTIONS``): ``auto`` is packed on an accelerator where the tower ``packs_images``, and
    transformers' default elsewhere (on CPU the two measured alike, and the default is
    transformers' own result bit for bit); returns the implementation set."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, not {attention!r}")
    if attention == "auto":
        if not (packs_images and on_accelerator):
            return str(model.config._attn_implementation)
        attention = "packed"
    if attention == "packed":
        register_packed_attention()
        # NOTE: set on the config, not by set_attn_implementation, which would look for a
        # flash-attention kernel of that name.
        model.config._attn_implementation = PACKED_ATTENTION
        return PACKED_ATTENTION
    model.set_attn_implementation(attention)
    return attention
