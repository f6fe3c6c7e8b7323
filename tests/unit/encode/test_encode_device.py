"""The encoder's device carries its index: it registers ``cuda:0``, not ``cuda``."""

from __future__ import annotations

import pytest
import torch

from epd.server.encode.vision import ACCELERATORS
from epd.server.engine import device as device_module
from epd.server.engine.device import resolve_device


def encoder_device(name: str) -> str:
    return resolve_device(name, accelerators=ACCELERATORS)


def test_cuda_and_auto_resolve_to_the_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert encoder_device("cuda") == "cuda:0"
    assert encoder_device("auto") == "cuda:0"
    assert encoder_device("cuda:1") == "cuda:1"
    assert encoder_device("cpu") == "cpu"


def test_cuda_where_there_is_none_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        encoder_device("cuda")
    assert not encoder_device("auto").startswith("cuda")


def test_xpu_is_the_encoders_second_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module, "xpu_available", lambda: True)
    assert encoder_device("auto") == "xpu:0"
    assert encoder_device("xpu:1") == "xpu:1"
    monkeypatch.setattr(device_module, "xpu_available", lambda: False)
    assert encoder_device("auto") == "cpu"
    with pytest.raises(ValueError, match="XPU is not available"):
        encoder_device("xpu")


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "cpu:0", "auto:1"])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, xpu"):
        encoder_device(name)


def test_engines_take_cuda_alone() -> None:
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, not 'xpu'"):
        resolve_device("xpu")
