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


def resolve_device(
    name: str,
    cuda_index: Callable[[], int | None] = cuda_device_index,
    *,
    accelerators: tuple[str, ...] = (CUDA,),
) -> str:
    """``cpu`` or ``TYPE:N`` (the device torch names, as registered) for ``--device name``.

    ``accelerators``: the device types the caller runs on besides the CPU (engines: CUDA; the
    encoder: CUDA, then XPU), each also with an index (``cuda:1``). ``auto``: the first of them
    usable here, else CPU. An accelerator without an index gets the first visible one (vLLM's
    rank 0, a fresh process's current device). One not usable here, or a name of another type:
    ValueError. ``cuda_index`` finds the CUDA device (None: none usable); tests pass their own.
    """
    choices = ("auto", CPU, *accelerators)
    kind, _, index = name.partition(":")
    if kind not in choices or (index and (kind in choices[:2] or not index.isdigit())):
        raise ValueError(f"device must be one of {', '.join(choices)}, not {name!r}")
    if kind == "auto":
        kind = next((k for k in accelerators if _first_index(k, cuda_index) is not None), CPU)
    if kind == CPU:
        return CPU
    first = _first_index(kind, cuda_index)
    if first is None:
        raise ValueError(f"--device {name} asked for, but {kind.upper()} is not available here")
    return f"{kind}:{index or first}"


def _first_index(kind: str, cuda_index: Callable[[], int | None]) -> int | None:
    if kind == CUDA:
        return cuda_index()
    return 0 if xpu_available() else None


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
