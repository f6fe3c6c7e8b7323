"""The device an engine runs on, and the engine settings whose defaults follow from it.

Pure functions: the CLI resolves ``--device`` once (``resolve_device``) and fills every setting
left unset from ``defaults_for``; the engines get the results in their options dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CPU = "cpu"
CUDA = "cuda"
XPU = "xpu"
DEVICE_CHOICES = ("auto", CPU, CUDA)
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def cuda_device_index() -> int | None:
    """The CUDA device a fresh process computes on (0: the first visible one, vLLM's rank 0),
    or None where CUDA is not usable. Imports torch; does not initialise CUDA, so vLLM may still
    fork its engine processes."""
    import torch

    return 0 if torch.cuda.is_available() else None


def xpu_available() -> bool:
    """Whether an Intel XPU is usable here (imports torch)."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return xpu is not None and bool(xpu.is_available())


def resolve_device(name: str, cuda_index: Callable[[], int | None] = cuda_device_index) -> str:
    """``cpu`` or ``cuda:N`` (the device torch names, as registered) for ``--device name``.

    ``auto``: CUDA where usable, else CPU. ``cuda`` where CUDA is not usable: ValueError.
    ``cuda_index`` finds the CUDA device (None: none usable); tests pass their own.
    """
    if name not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)}, not {name!r}")
    if name == CPU:
        return CPU
    index = cuda_index()
    if index is None:
        if name == CUDA:
            raise ValueError("--device cuda asked for, but CUDA is not available here")
        return CPU
    return f"{CUDA}:{index}"


def device_type(device: str) -> str:
    """``cuda`` for ``cuda:0``; what vLLM's platform and its KV buffer device are named."""
    return device.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class DeviceDefaults:
    """What an engine flag left unset means on a device type.

    ``kv_cache_mb``: None lets vLLM size the KV cache from ``--gpu-memory-utilization``.
    """

    dtype: str
    enforce_eager: bool
    kv_cache_mb: int | None


DEFAULTS = {
    # NOTE: vLLM's automatic KV sizing fails on small CPU machines; compiling costs more start
    # time on CPU than it saves.
    CPU: DeviceDefaults(dtype="float32", enforce_eager=True, kv_cache_mb=256),
    CUDA: DeviceDefaults(dtype="bfloat16", enforce_eager=False, kv_cache_mb=None),
}


def defaults_for(device: str) -> DeviceDefaults:
    """The defaults of ``device`` (``cpu``, ``cuda`` or ``cuda:N``)."""
    return DEFAULTS[device_type(device)]
