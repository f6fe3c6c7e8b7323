"""The tower's faster execution computes what transformers' modules compute: a kernel-sized
convolution as a matrix product, and attention within each packed sequence in runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn

from epd.server.encode.fast_tower import (
    KernelSizedConv,
    equal_runs,
    packed_attention,
    runs_of,
    speed_up_patch_embeddings,
)


def test_equal_consecutive_sequences_form_runs() -> None:
    assert equal_runs([0, 4, 8, 12, 14, 16, 16, 20]) == [(0, 3, 4), (12, 2, 2), (16, 1, 4)]
    assert equal_runs([0]) == []


def test_a_bounds_tensor_is_read_once_for_every_layer() -> None:
    bounds = torch.tensor([0, 4, 8, 10])
    first = runs_of(bounds)
    assert first == [(0, 2, 4), (8, 1, 2)]
    assert runs_of(bounds) is first
    assert runs_of(torch.tensor([0, 5])) == [(0, 1, 5)]


@pytest.mark.parametrize("bounds", [[0, 16, 32, 48], [0, 9, 18, 25, 30, 39], [0, 64]])
def test_packed_attention_equals_attention_within_each_sequence(bounds: list[int]) -> None:
    torch.manual_seed(0)
    heads, head_dim, total = 3, 8, bounds[-1]
    query, key, value = (torch.randn(1, heads, total, head_dim) for _ in range(3))
    got, _ = packed_attention(
        nn.Module(), query, key, value, None, scaling=0.3, cu_seq_lens_q=torch.tensor(bounds)
    )
    expected = torch.cat(
        [
            F.scaled_dot_product_attention(
                query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], scale=0.3
            )
            for a, b in zip(bounds, bounds[1:], strict=False)
        ],
        dim=2,
    ).transpose(1, 2)
    assert got.shape == (1, total, heads, head_dim)
    assert torch.allclose(got, expected, atol=1e-6)


def test_a_kernel_sized_convolution_is_a_matrix_product_of_its_patches() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv3d(3, 16, (2, 14, 14), stride=(2, 14, 14)), nn.Conv2d(2, 2, 3))
    patches = torch.randn(40, 3, 2, 14, 14)
    expected = model[0](patches)
    assert speed_up_patch_embeddings(model) == 1  # NOTE: the 3x3 stride-1 one is no patch embedding
    assert isinstance(model[0], KernelSizedConv) and isinstance(model[1], nn.Conv2d)
    assert torch.allclose(model[0](patches), expected, atol=1e-5)
    larger = torch.randn(1, 3, 4, 28, 28)
    assert model[0](larger).shape == (1, 16, 2, 2, 2)  # NOTE: other inputs: the convolution
