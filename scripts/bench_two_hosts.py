"""Embeddings handoff between two hosts on one machine (network namespaces joined by a veth pair,
UCX over TCP on it, as tests/integration/e2e/test_two_hosts.py runs them): a NIXL READ of a
tensor ``put`` on host a, timed on host b, against a plain TCP copy of the same bytes over the
same veth (b asks, a sends, b receives into a warm buffer). The fixed cost is the same handoff of a
4-byte tensor. Needs root.

    .venv/bin/python scripts/bench_two_hosts.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

SIZES = [4, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
PORT = 50399


def _exactly(conn: socket.socket, view: memoryview) -> None:
    while view:
        received = conn.recv_into(view)
        if not received:
            raise ConnectionError("peer closed")
        view = view[received:]


def _message(conn: socket.socket) -> bytes:
    header = bytearray(4)
    _exactly(conn, memoryview(header))
    body = bytearray(struct.unpack("!I", header)[0])
    _exactly(conn, memoryview(body))
    return bytes(body)


def _send(conn: socket.socket, data: bytes) -> None:
    conn.sendall(struct.pack("!I", len(data)) + data)


def produce(address: str, consumer_host_id: str, repeats: int) -> None:
    """Host a: for each size, ``repeats`` times a NIXL reference, then the raw bytes on demand."""
    import torch

    from epd.server.transfer.plane import DataPlane

    plane = DataPlane()
    with socket.create_server((address, PORT)) as server:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for size in SIZES:
            tensor = torch.ones(1, max(size // 4, 1))
            payload = tensor.numpy().tobytes()
            for _ in range(repeats + 1):
                _send(conn, plane.put(tensor, consumer_host_id).SerializeToString())
                _message(conn)  # NOTE: read by the consumer
            for _ in range(repeats + 1):
                _message(conn)  # NOTE: asked for
                conn.sendall(payload)
    plane.close()


def consume(address: str, repeats: int) -> None:
    """Host b: time each READ and each TCP copy; print one JSON object of medians in seconds."""
    from epd.server.transfer.plane import DataPlane
    from epd.v1 import tensor_pb2

    plane = DataPlane()
    for _ in range(100):
        try:
            conn = socket.create_connection((address, PORT))
            break
        except OSError:
            time.sleep(0.1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    results = {}
    for size in SIZES:
        nixl, tcp = [], []
        for _ in range(repeats + 1):
            ref = tensor_pb2.TensorRef.FromString(_message(conn))
            begin = time.perf_counter()
            tensor = plane.get(ref)
            nixl.append(time.perf_counter() - begin)
            del tensor
            _send(conn, b"read")
        buffer = bytearray(max(size // 4, 1) * 4)
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            _send(conn, b"send")
            _exactly(conn, memoryview(buffer))
            tcp.append(time.perf_counter() - begin)
        results[size] = {"nixl": statistics.median(nixl[1:]), "tcp": statistics.median(tcp[1:])}
    print(json.dumps(results))
    plane.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed repetitions per size")
    parser.add_argument("--role", choices=["produce", "consume"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--consumer-host-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "produce":
        produce(args.address, args.consumer_host_id, args.repeats)
        return 0
    if args.role == "consume":
        consume(args.address, args.repeats)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.integration.e2e.netns import skip_reason, two_hosts

    if skip_reason():
        print(f"bench_two_hosts: {skip_reason()}", file=sys.stderr)
        return 2
    script = str(Path(__file__).resolve())
    repeats = ["--repeats", str(args.repeats)]
    with tempfile.TemporaryDirectory() as work, two_hosts(Path(work)) as (a, b):
        producer = a.spawn(
            [
                script,
                "--role",
                "produce",
                "--address",
                a.address,
                "--consumer-host-id",
                b.host_id,
                *repeats,
            ],
            Path(work) / "producer.log",
        )
        consumer = b.python(
            script, "--role", "consume", "--address", a.address, *repeats, timeout_s=600
        )
        producer.wait(60)
        if consumer.returncode != 0:
            print(consumer.stderr, (Path(work) / "producer.log").read_text(), file=sys.stderr)
            return 1
    results = json.loads(consumer.stdout.strip().splitlines()[-1])
    print(f"{'bytes':>10} {'nixl ms':>9} {'tcp ms':>9} {'nixl GB/s':>10} {'tcp GB/s':>9}")
    for size, row in results.items():
        nixl, tcp = row["nixl"], row["tcp"]
        print(
            f"{int(size):>10} {nixl * 1e3:>9.3f} {tcp * 1e3:>9.3f} "
            f"{int(size) / nixl / 1e9:>10.2f} {int(size) / tcp / 1e9:>9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
