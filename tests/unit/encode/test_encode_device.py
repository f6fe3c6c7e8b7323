"""The encoder's device carries its index: it registers ``cuda:0``, not ``cuda``."""

from __future__ import annotations

import pytest
import torch

from epd.server.encode.vision import resolve_device


def test_cuda_and_auto_resolve_to_the_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert str(resolve_device("cuda")) == "cuda:0"
    assert str(resolve_device("auto")) == "cuda:0"
    assert str(resolve_device("cuda:1")) == "cuda:1"
    assert str(resolve_device("cpu")) == "cpu"


def test_cuda_where_there_is_none_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    assert resolve_device("auto").type != "cuda"
