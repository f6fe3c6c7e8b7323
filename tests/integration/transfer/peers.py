"""Processes on the other end of a handoff, started with multiprocessing's spawn context."""

from __future__ import annotations

import hashlib
import os
from multiprocessing.connection import Connection

import torch

from epd.server.common.errors import EpdError
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's payload bytes."""
    flat = tensor.contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def make_tensor(dtype: torch.dtype, num_bytes: int, seed: int) -> torch.Tensor:
    """A deterministic tensor of ``dtype`` with exactly ``num_bytes`` of payload."""
    numel = num_bytes // torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator).to(dtype).reshape(-1, 16)


def consumer(conn: Connection, host_id: str) -> None:
    """Read each reference sent on ``conn``; answer ("ok", digest, shape) or ("error", reason).
    A reference sent with hold=True is viewed and kept open until the process dies."""
    plane = DataPlane(host_id)
    held = []
    while (message := conn.recv()) is not None:
        data, hold = message
        ref = tensor_pb2.TensorRef.FromString(data)
        try:
            tensor = plane.get(ref)
            if hold:
                held.append(tensor)
            conn.send(("ok", digest(tensor), list(tensor.shape), str(tensor.dtype)))
        except EpdError as e:
            conn.send(("error", e.reason, type(e).__name__))


def producer(conn: Connection, host_id: str) -> None:
    """Put one tensor, send its reference and segment name, then wait to be killed."""
    plane = DataPlane(host_id)
    ref = plane.put(make_tensor(torch.float32, 1 << 20, seed=7), host_id)
    conn.send((ref.SerializeToString(), ref.shm.name, os.getpid()))
    conn.recv()
