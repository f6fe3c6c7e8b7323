"""Dtype mapping and validation of TensorRef metadata (no payload access)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from epd.common.errors import InvalidArgument
from epd.v1 import tensor_pb2

DTYPES: dict[int, torch.dtype] = {
    tensor_pb2.SCALAR_TYPE_FLOAT32: torch.float32,
    tensor_pb2.SCALAR_TYPE_FLOAT16: torch.float16,
    tensor_pb2.SCALAR_TYPE_BFLOAT16: torch.bfloat16,
    tensor_pb2.SCALAR_TYPE_INT64: torch.int64,
    tensor_pb2.SCALAR_TYPE_INT32: torch.int32,
    tensor_pb2.SCALAR_TYPE_UINT8: torch.uint8,
}
SCALAR_TYPES: dict[torch.dtype, Any] = {dtype: scalar for scalar, dtype in DTYPES.items()}
ITEM_SIZES: dict[torch.dtype, int] = {dtype: dtype.itemsize for dtype in SCALAR_TYPES}
# NOTE: ctypes.memmove lets go of the GIL around the copy; taking it back in a process with other
# threads (NIXL's polling thread, gRPC's) costs more than copying 16 KiB. Copies up to this size
# go through a memmove prototype that keeps the GIL (PYFUNCTYPE) instead.
GIL_HELD_COPY_MAX_BYTES = 64 << 10
_MEMMOVE_ADDRESS = ctypes.cast(ctypes.memmove, ctypes.c_void_p).value
assert _MEMMOVE_ADDRESS, "ctypes.memmove has no address"
_memmove_holding_gil = ctypes.PYFUNCTYPE(
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)(_MEMMOVE_ADDRESS)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a CPU tensor's payload (contiguous copy only when needed)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8)


def copy_payload(address: int, tensor: torch.Tensor) -> None:
    """Copy the payload bytes of ``tensor`` (C order) to host memory at ``address``; the caller
    guarantees room for them. A CPU tensor takes one plain memcpy; a device tensor one copy
    down, straight to ``address`` (``stage_to_host``).

    NOTE: ``Tensor.copy_`` splits large host copies across torch's intra-op threads; on a small,
    busy machine a thread that is not scheduled stalls the copy (docs/transfer.md)."""
    if not tensor.is_cpu:
        stage_to_host(address, tensor)
        return
    source = tensor if tensor.is_contiguous() else tensor.contiguous()
    num_bytes = source.nbytes
    if num_bytes:
        move(address, source.data_ptr(), num_bytes)


def stage_to_host(address: int, tensor: torch.Tensor) -> None:
    """Copy ``tensor`` (any device) to host memory at ``address`` in C order with one
    ``Tensor.copy_`` into a view of that memory: a device tensor crosses to the host once, with
    no host tensor in between. Returns when the bytes are there."""
    num_bytes = tensor.nbytes
    if not num_bytes:
        return
    memory = (ctypes.c_char * num_bytes).from_address(address)
    destination = torch.frombuffer(memory, dtype=torch.uint8).view(tensor.dtype)
    destination.view(tensor.shape).copy_(tensor.detach())


def move(destination: int, source: int, num_bytes: int) -> None:
    """memmove ``num_bytes`` from address ``source`` to address ``destination``; the GIL is let
    go only for copies over ``GIL_HELD_COPY_MAX_BYTES``."""
    if num_bytes <= GIL_HELD_COPY_MAX_BYTES:
        _memmove_holding_gil(destination, source, num_bytes)
    else:
        ctypes.memmove(destination, source, num_bytes)


def describe(tensor: torch.Tensor) -> tensor_pb2.TensorRef:
    """A TensorRef with dtype, shape and byte size of ``tensor`` and no location yet;
    InvalidArgument for dtypes the plane cannot carry."""
    scalar_type = SCALAR_TYPES.get(tensor.dtype)
    if scalar_type is None:
        raise InvalidArgument(
            f"dtype {tensor.dtype} cannot be transferred; use one of "
            f"{sorted(str(d) for d in SCALAR_TYPES)}",
            reason="UNSUPPORTED_DTYPE",
        )
    return tensor_pb2.TensorRef(dtype=scalar_type, shape=tensor.shape, byte_size=tensor.nbytes)


def check_layout(ref: tensor_pb2.TensorRef) -> tuple[torch.dtype, list[int]]:
    """Validate dtype, shape and byte size; return the torch dtype and the shape. Raises
    InvalidArgument. The location is the reading backend's to check: the data plane hands a
    reference to the consumer its location names."""
    dtype = DTYPES.get(ref.dtype)
    if dtype is None:
        raise InvalidArgument(f"TensorRef has unknown dtype {ref.dtype}", reason="BAD_TENSOR_REF")
    # NOTE: slicing a repeated field is much faster than iterating it with tuple() (upb).
    shape = ref.shape[:]
    expected = ITEM_SIZES[dtype]
    for dim in shape:
        if dim < 0:
            raise InvalidArgument(
                f"TensorRef has a negative dimension: {shape}", reason="BAD_TENSOR_REF"
            )
        expected *= dim
    if ref.byte_size != expected:
        raise InvalidArgument(
            f"TensorRef byte_size {ref.byte_size} does not match shape {shape} of "
            f"{dtype} ({expected} bytes)",
            reason="TENSOR_SIZE_MISMATCH",
        )
    return dtype, shape


def view_bytes(
    buffer: object, dtype: torch.dtype, shape: Sequence[int], byte_size: int
) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` viewing the first ``byte_size`` bytes of ``buffer``
    (writable, no copy)."""
    if byte_size == 0:
        return torch.empty(tuple(shape), dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=dtype, count=byte_size // ITEM_SIZES[dtype])  # type: ignore[call-overload]
    return shaped(flat, shape)


def shaped(flat: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``flat`` (1-D, as many elements as ``shape`` holds) viewed as ``shape``.

    NOTE: ``view(*sizes)`` parses its arguments faster than ``view(shape)`` or ``reshape``,
    above all as the first tensor call of a process just woken by a request; a 1-D shape needs
    no view at all."""
    if len(shape) == 1:
        return flat
    return flat.view(*shape) if shape else flat.view(())
