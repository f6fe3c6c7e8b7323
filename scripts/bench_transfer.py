"""Data-plane benchmark: handoff bandwidth and fixed cost per backend vs in-process memcpy.

For each size, in one run on this machine:
- memcpy: one plain memcpy into a warm buffer in one process (the reference every ratio is
  against); ``torch copy_`` (intra-op threads) is shown beside it: faster on idle cores, very slow
  when another process holds them, which is why the data plane copies with plain memcpy;
- shm: ``put`` in this process + ``get`` (zero-copy view) in a second process;
- nixl: ``put`` into a registered buffer here + ``get`` (one NIXL READ into the second process's
  registered buffer, viewed without a further copy) there, agents connected beforehand;
- cma: the second process copies the tensor out of this one with one ``process_vm_readv`` call
  into a warm buffer (no data plane at all): the kernel's cross-process copy that UCX uses for a
  NIXL READ on one host, i.e. the ceiling of a same-host READ;
- inline: ``put`` + serialise the TensorRef, parse it + ``get`` (what a gRPC message carries,
  without the network);
- grpc-bytes: a real unary gRPC call carrying the payload to a second process (the baseline the
  data plane exists to avoid).
The fixed per-handoff cost is the same measurement for a 4-byte tensor (control work only).
With ``--copy`` the second process asks for private copies (``get(copy=True)``, what prefill
workers do) instead of views.
Every tensor is 2-D ([1, n]), as embeddings are, so each handoff shapes its result as theirs do.
Timings of a handoff add the producer's ``put`` and the consumer's ``get``, measured where each
runs; the pipe that stands in for the gRPC message carrying the TensorRef is not counted.

    .venv/bin/python scripts/bench_transfer.py [--repeats N] [--copy] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent import futures
from multiprocessing.connection import Connection

import torch

from epd.server.transfer.plane import DataPlane
from epd.server.transfer.tensors import copy_payload
from epd.v1 import tensor_pb2

SIZES = {"64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "128MiB": 128 << 20}
HOST = "bench-host"
KINDS = {"shm": tensor_pb2.TRANSFER_KIND_SHM, "nixl": tensor_pb2.TRANSFER_KIND_NIXL}
SPAWN = multiprocessing.get_context("spawn")


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


# NOTE: looked up once: a CDLL lookup inside the timed call would be counted in the cma cells.
_PROCESS_VM_READV = ctypes.CDLL(None, use_errno=True).process_vm_readv


def _read_vm(pid: int, local_address: int, address: int, num_bytes: int) -> bool:
    """One ``process_vm_readv`` of ``num_bytes``; False where the kernel refuses (ptrace rules)."""
    local, remote = _IoVec(local_address, num_bytes), _IoVec(address, num_bytes)
    num_read = _PROCESS_VM_READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return bool(num_read == num_bytes)


def _cma_read(
    buffers: dict[int, ctypes.Array[ctypes.c_char]], pid: int, address: int, num_bytes: int
) -> float:
    """Seconds to copy ``num_bytes`` at ``address`` of ``pid`` into a warm buffer with one
    ``process_vm_readv``; NaN where refused."""
    if num_bytes not in buffers:
        buffers[num_bytes] = ctypes.create_string_buffer(num_bytes)
    local = ctypes.addressof(buffers[num_bytes])
    start = time.perf_counter()
    done = _read_vm(pid, local, address, num_bytes)
    seconds = time.perf_counter() - start
    return seconds if done else float("nan")


def _consumer(conn: Connection, copy: bool) -> None:
    plane = DataPlane(HOST)
    buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}
    while (data := conn.recv()) is not None:
        if isinstance(data, tuple):
            conn.send(_cma_read(buffers, *data))
            continue
        ref = tensor_pb2.TensorRef.FromString(data)
        start = time.perf_counter()
        plane.get(ref, copy=copy)
        conn.send(time.perf_counter() - start)


def _grpc_server(conn: Connection) -> None:
    import grpc

    server = grpc.server(
        futures.ThreadPoolExecutor(2), options=[("grpc.max_receive_message_length", 256 << 20)]
    )
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
    generic = grpc.method_handlers_generic_handler("bench", {"Send": handler})
    server.add_generic_rpc_handlers([generic])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn.send(port)
    conn.recv()
    server.stop(0)


def measure(repeats: int, copy: bool = False) -> dict[str, dict[str, float]]:
    plane = DataPlane(HOST, max_inline_bytes=256 << 20)
    conn, child = SPAWN.Pipe()
    consumer = SPAWN.Process(target=_consumer, args=(child, copy), daemon=True)
    consumer.start()
    grpc_conn, grpc_child = SPAWN.Pipe()
    grpc_process = SPAWN.Process(target=_grpc_server, args=(grpc_child,), daemon=True)
    grpc_process.start()
    import grpc

    channel = grpc.insecure_channel(
        f"127.0.0.1:{grpc_conn.recv()}", options=[("grpc.max_send_message_length", 256 << 20)]
    )
    send = channel.unary_unary("/bench/Send")

    def handoff(tensor: torch.Tensor, kind: str) -> float:
        start = time.perf_counter()
        ref = plane.put(tensor, HOST, preferred=KINDS[kind])
        put_s = time.perf_counter() - start
        conn.send(ref.SerializeToString())
        get_s: float = conn.recv()
        plane.release([ref.lease_id])
        return put_s + get_s

    def cma_read(tensor: torch.Tensor) -> float:
        conn.send((os.getpid(), tensor.data_ptr(), tensor.nbytes))
        seconds: float = conn.recv()
        return seconds

    def inline_handoff(tensor: torch.Tensor) -> None:
        ref = plane.put(tensor, HOST, preferred=tensor_pb2.TRANSFER_KIND_INLINE)
        data = ref.SerializeToString()
        plane.get(tensor_pb2.TensorRef.FromString(data))

    results: dict[str, dict[str, float]] = {}
    for label, num_bytes in {"4B": 4, **SIZES}.items():
        reps = repeats if num_bytes <= 16 << 20 else max(5, repeats // 4)
        # NOTE: 2-D like embeddings ([num_tokens, hidden]): a 1-D tensor skips the reshape.
        src = torch.randn(1, max(num_bytes // 4, 1))
        dst = torch.empty_like(src)
        payload = src.numpy().tobytes()
        cells: dict[str, Callable[[], float]] = {
            "memcpy_s": lambda d=dst, s=src: _timed(lambda: copy_payload(d.data_ptr(), s)),
            "torch_copy_s": lambda d=dst, s=src: _timed(lambda: d.copy_(s)),
            "shm_s": lambda s=src: handoff(s, "shm"),
            "nixl_s": lambda s=src: handoff(s, "nixl"),
            "cma_s": lambda s=src: cma_read(s),
            "inline_s": lambda s=src: _timed(lambda: inline_handoff(s)),
            "grpc_bytes_s": lambda p=payload: _timed(lambda: send(p)),
        }
        # NOTE: one sample of every cell per round, so that load from other processes on a shared
        # machine falls on all of them alike; the first round warms up and is not counted.
        samples: dict[str, list[float]] = {name: [] for name in cells}
        for round_index in range(reps + 1):
            for name, sample in cells.items():
                seconds = sample()
                if round_index:
                    samples[name].append(seconds)
        results[label] = {
            "bytes": num_bytes,
            **{name: statistics.median(values) for name, values in samples.items()},
        }
    conn.send(None)
    grpc_conn.send(None)
    consumer.join(10)
    grpc_process.join(10)
    channel.close()
    plane.close()
    return results


BACKENDS = ("shm", "nixl", "cma", "inline", "grpc_bytes")


def table(results: dict[str, dict[str, float]]) -> str:
    fixed = results["4B"]
    lines = [
        "fixed per-handoff cost (4-byte tensor, p50): "
        + ", ".join(f"{name} {fixed[name + '_s'] * 1e3:.3f} ms" for name in BACKENDS),
        f"{'size':>7} | {'memcpy GB/s':>11} {'torch copy_':>11} | "
        + " | ".join(f"{name + ' GB/s':>15} {'x memcpy':>8}" for name in BACKENDS),
    ]
    for label, row in results.items():
        if label == "4B":
            continue
        cells = [
            f"{row['bytes'] / row[name + '_s'] / 1e9:15.2f} "
            f"{row['memcpy_s'] / row[name + '_s']:8.2f}"
            for name in BACKENDS
        ]
        memcpy, torch_copy = (row["bytes"] / row[key] / 1e9 for key in ("memcpy_s", "torch_copy_s"))
        lines.append(f"{label:>7} | {memcpy:11.2f} {torch_copy:11.2f} | " + " | ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed repetitions per cell")
    parser.add_argument(
        "--copy",
        action="store_true",
        help="the consumer asks for private copies instead of zero-copy views",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    # NOTE: as the services' command lines do (--nixl-log-level): NIXL's INFO lines are noise.
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    results = measure(args.repeats, args.copy)
    print(json.dumps(results) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
