"""Processes on the other end of a handoff, started with multiprocessing's spawn context."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import threading
from concurrent import futures
from multiprocessing.connection import Connection

import torch

from epd.common.errors import EpdError
from epd.server.transfer import nixl_agent
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2

HOST = "test-host"
SPAWN = multiprocessing.get_context("spawn")


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's payload bytes."""
    flat = tensor.contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def make_tensor(dtype: torch.dtype, num_bytes: int, seed: int) -> torch.Tensor:
    """A deterministic tensor of ``dtype`` with exactly ``num_bytes`` of payload."""
    numel = num_bytes // torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator).to(dtype).reshape(-1, 16)


def put_concurrently(
    plane: DataPlane, tensors: list[torch.Tensor], consumer_host_id: str, num_threads: int = 4
) -> list[tensor_pb2.TensorRef]:
    """Put every tensor from ``num_threads`` threads at once; the references in tensor order."""
    refs: list[tensor_pb2.TensorRef | None] = [None] * len(tensors)

    def put_every(start: int) -> None:
        for i in range(start, len(tensors), num_threads):
            refs[i] = plane.put(tensors[i], consumer_host_id)

    threads = [threading.Thread(target=put_every, args=(start,)) for start in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(ref is not None for ref in refs), "a put failed"
    return [ref for ref in refs if ref is not None]


def consumer(conn: Connection, host_id: str) -> None:
    """Read each reference sent on ``conn``; answer ("ok", digest, shape) or ("error", reason).
    A reference sent with hold=True is viewed and kept open until the process dies; one sent with
    copy=True is read as a private copy.
    "outstanding" answers how many NIXL receive blocks are in use; "close" closes the plane and
    answers how many NIXL regions stay registered. A list of references is read by as many
    threads at once; the answer is the list of their answers."""
    plane = DataPlane(host_id)
    held = []
    while (message := conn.recv()) is not None:
        if message == "outstanding":
            conn.send(plane.consumers["nixl"].num_outstanding)  # type: ignore[attr-defined]
            continue
        if message == "close":
            plane.close()
            conn.send(nixl_agent.num_registered_regions())
            continue
        if isinstance(message, list):
            with futures.ThreadPoolExecutor(len(message)) as pool:
                conn.send(list(pool.map(lambda data: _read(plane, data), message)))
            continue
        data, hold, copy = message
        conn.send(_read(plane, data, held if hold else None, copy=copy))


def _read(
    plane: DataPlane, data: bytes, held: list[torch.Tensor] | None = None, *, copy: bool = False
) -> tuple:
    """("ok", digest, shape, dtype) of the tensor behind a serialized reference (a view, or a
    private copy), or ("error", reason, error type); the tensor is kept in ``held`` when given."""
    try:
        tensor = plane.get(tensor_pb2.TensorRef.FromString(data), copy=copy)
    except EpdError as e:
        return ("error", e.reason, type(e).__name__)
    if held is not None:
        held.append(tensor)
    answer = ("ok", digest(tensor), list(tensor.shape), str(tensor.dtype))
    del tensor  # NOTE: a NIXL view keeps its receive block until it is dropped.
    return answer


def producer(conn: Connection, host_id: str, consumer_host_id: str = "") -> None:
    """Put one tensor for ``consumer_host_id`` (default: this host), send its reference and
    segment name, then wait to be killed."""
    plane = DataPlane(host_id)
    ref = plane.put(make_tensor(torch.float32, 1 << 20, seed=7), consumer_host_id or host_id)
    conn.send((ref.SerializeToString(), ref.shm.name, os.getpid()))
    conn.recv()


def reference_of_a_killed_producer(host_id: str, consumer_host_id: str) -> bytes:
    """A serialized reference to a tensor (1 MiB, lent by NIXL or in shared memory) whose
    producer process was then killed."""
    conn, child_conn = SPAWN.Pipe()
    process = SPAWN.Process(
        target=producer, args=(child_conn, host_id, consumer_host_id), daemon=True
    )
    process.start()
    assert conn.poll(120), "producer did not answer"
    data, _, pid = conn.recv()
    os.kill(pid, signal.SIGKILL)
    process.join(10)
    return data  # type: ignore[no-any-return]


class Peer:
    """A consumer process (see ``consumer``) and the pipe to it."""

    def __init__(self, host_id: str = HOST) -> None:
        self.conn, child_conn = SPAWN.Pipe()
        self.process = SPAWN.Process(target=consumer, args=(child_conn, host_id), daemon=True)
        self.process.start()

    def ask(self, message: object, timeout_s: float = 120) -> tuple:
        self.conn.send(message)
        assert self.conn.poll(timeout_s), "consumer did not answer"
        return self.conn.recv()  # type: ignore[no-any-return]

    def read(self, ref: tensor_pb2.TensorRef, hold: bool = False, copy: bool = False) -> tuple:
        return self.ask((ref.SerializeToString(), hold, copy))

    def stop(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
        self.process.join(30)
