"""The inline backend: the payload travels inside the TensorRef. For small tensors and as the
last fallback across hosts; nothing is held, so there is nothing to release."""

from __future__ import annotations

import torch

from epd.common.errors import InvalidArgument
from epd.server.transfer.base import TensorConsumer, TensorProducer
from epd.server.transfer.tensors import as_bytes, check_layout, describe, view_bytes
from epd.v1 import tensor_pb2


class InlineProducer(TensorProducer):
    """Serialises the payload into the reference."""

    kind = "inline"

    def put(self, tensor: torch.Tensor, *, ttl_s: float | None = None) -> tensor_pb2.TensorRef:
        ref = describe(tensor)
        ref.inline_data = as_bytes(tensor.cpu()).numpy().tobytes()
        return ref


class InlineConsumer(TensorConsumer):
    """Reads the payload out of the reference (always a private copy)."""

    kind = "inline"

    def get(self, ref: tensor_pb2.TensorRef, *, copy: bool = False) -> torch.Tensor:
        dtype, shape = check_layout(ref)
        if len(ref.inline_data) != ref.byte_size:
            raise InvalidArgument(
                f"inline payload has {len(ref.inline_data)} bytes, TensorRef says {ref.byte_size}",
                reason="TENSOR_SIZE_MISMATCH",
            )
        return view_bytes(bytearray(ref.inline_data), dtype, shape, ref.byte_size)
