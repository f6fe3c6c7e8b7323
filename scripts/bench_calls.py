"""Call benchmark: one call per RPC against the same call as a frame on an open call session.

A second process serves an echo ``EncodeService`` (each ``Encode`` answers one response per item
at once, so only the transport is timed) through the same ``build_server`` and ``serve_session``
as the real services; this process calls it through ``EncoderClient`` as the route does, with
sessions off (a new RPC per call) and on (frames on one stream), in the same run.

Figures per mode:
- first response p50 / p90: sequential calls, from the call to its first response (what a
  request's TTFT pays per hop);
- whole call p50: to the end of the call (the response marked ``last`` or the RPC's status);
- calls/s with 16 in flight: throughput of one client process.

    .venv/bin/python scripts/bench_calls.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import Any

CONCURRENCY = 16


def serve(port_pipe: Connection) -> None:
    """The echo server's process: report the port, serve until the pipe closes."""
    asyncio.run(_serve(port_pipe))


async def _serve(port_pipe: Connection) -> None:
    from epd.server.common.server import ServiceBinding, build_server
    from epd.server.common.sessions import SessionDrain, serve_session
    from epd.v1 import encode_service_pb2 as pb
    from epd.v1 import encode_service_pb2_grpc as pb_grpc

    class EchoEncoder(pb_grpc.EncodeServiceServicer):
        def __init__(self) -> None:
            self.sessions = SessionDrain()

        async def Encode(self, request: Any, context: Any) -> AsyncIterator[Any]:
            for index, item in enumerate(request.items):
                yield pb.EncodeResponse(item_index=index, mm_hash=item.mm_hash)

        async def EncodeSession(self, frames: Any, context: Any) -> None:
            await serve_session(frames, context, self.Encode, pb.EncodeSessionResponse,
                                self.sessions, final=_all_items)  # fmt: skip

    binding = ServiceBinding("epd.v1.EncodeService", EchoEncoder(),
                             pb_grpc.add_EncodeServiceServicer_to_server)  # fmt: skip
    server, port = await build_server([binding])
    port_pipe.send(port)
    await asyncio.get_running_loop().run_in_executor(None, _wait_closed, port_pipe)
    await server.drain_and_stop(0)


def _all_items(request: Any, count: int, _: Any) -> bool:
    return bool(count == len(request.items))


def _wait_closed(pipe: Connection) -> None:
    with contextlib.suppress(EOFError):
        pipe.recv()


async def measure(port: int, num_calls: int) -> dict[str, dict[str, float]]:
    from epd.server.common.channels import create_channel
    from epd.server.common.clients import EncoderClient
    from epd.v1 import encode_service_pb2 as pb
    from epd.v1 import multimodal_pb2

    request = pb.EncodeRequest(items=[multimodal_pb2.MediaItem(mm_hash="x")])
    channel = create_channel(f"127.0.0.1:{port}")
    figures: dict[str, dict[str, float]] = {}
    try:
        for mode, sessions in (("per call", False), ("session", True)):
            client = EncoderClient(channel, sessions=sessions)
            first: list[float] = []
            whole: list[float] = []
            for _ in range(num_calls + num_calls // 10):  # the first tenth warms up
                start = time.perf_counter()
                call = client.Encode(request, timeout=10)
                responses = aiter(call)
                await anext(responses)
                first.append(time.perf_counter() - start)
                async for _ in responses:
                    pass
                whole.append(time.perf_counter() - start)
            rate = await throughput(client, request, num_calls)
            await client.close()
            skip = num_calls // 10
            figures[mode] = {
                "first_p50_ms": statistics.median(first[skip:]) * 1e3,
                "first_p90_ms": statistics.quantiles(first[skip:], n=10)[-1] * 1e3,
                "whole_p50_ms": statistics.median(whole[skip:]) * 1e3,
                "calls_per_s": rate,
            }
    finally:
        await channel.close()
    return figures


async def throughput(client: Any, request: Any, num_calls: int) -> float:
    """Calls per second with CONCURRENCY calls in flight."""
    remaining = num_calls

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            async for _ in client.Encode(request, timeout=10):
                pass

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return num_calls / (time.perf_counter() - start)


def report(figures: dict[str, dict[str, float]]) -> None:
    print(f"{'mode':10} {'first p50 ms':>13} {'first p90 ms':>13} {'whole p50 ms':>13} "
          f"{'calls/s @' + str(CONCURRENCY):>13}")  # fmt: skip
    for mode, row in figures.items():
        print(f"{mode:10} {row['first_p50_ms']:13.3f} {row['first_p90_ms']:13.3f} "
              f"{row['whole_p50_ms']:13.3f} {row['calls_per_s']:13.0f}")  # fmt: skip
    per_call, session = figures["per call"], figures["session"]
    first = session["first_p50_ms"] / per_call["first_p50_ms"]
    rate = session["calls_per_s"] / per_call["calls_per_s"]
    print(f"session / per call: first response {first:.2f}x, throughput {rate:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000,
                        help="sequential calls per mode, and calls of the throughput run "
                             "(default 1000)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    if args.calls < 20:
        parser.error("--calls must be at least 20")
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    server = context.Process(target=serve, args=(theirs,), daemon=True)
    server.start()
    theirs.close()
    try:
        if not ours.poll(60):
            print("the echo server did not start within 60 s", file=sys.stderr)
            return 1
        figures = asyncio.run(measure(ours.recv(), args.calls))
    finally:
        ours.send("stop")
        ours.close()
        server.join(10)
        if server.is_alive():
            server.kill()
    if args.json:
        print(json.dumps(figures))
    else:
        report(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
