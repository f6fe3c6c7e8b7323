"""The walk of one request through epd's own code: which files and functions an E/P/D request
with one image runs, from the route's HTTP door to the streamed tokens (docs/architecture.md).

Every service runs in this process (route with its OpenAI HTTP door, scheduler, encoder, prefill
worker handing its KV to a decode worker, both on vLLM) and a profile hook records each call of a
function of epd's hand-written code (not the generated stubs; comprehensions and lambdas are
part of the function they are written in) while a request is answered: on
the event loop and in every thread started after the hook. Three requests, each with a picture
of its own, are walked; a function counts when each ran it, so background work that happened to
run during one (heartbeats, the reaper, a refresh of the route's view) is left out. Startup is
not counted.

    .venv/bin/python scripts/request_walk.py [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import io
import json
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

import epd

# The folders installed under ``epd``; the rest of ``epd`` is the command line and epd/v1's stubs.
SUBPACKAGES = ("server", "common", "client", "launch", "scheduler")
Call = tuple[str, str]  # (file relative to the package, function's qualified name)


@dataclass
class CallRecorder:
    """Records the functions of epd's code called while ``is_recording``."""

    roots: dict[str, str] = field(default_factory=dict)  # absolute prefix -> shown prefix
    calls: set[Call] = field(default_factory=set)
    is_recording: bool = False

    def install(self) -> None:
        """Hook this thread and every thread started from now on."""
        self.roots = {f"{_folder(f'epd.{name}')}/": f"{name}/" for name in SUBPACKAGES}
        self.roots[f"{Path(epd.__file__).parent}/"] = "epd/"
        sys.setprofile(self._on_event)
        threading.setprofile(self._on_event)

    def uninstall(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def _on_event(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.is_recording or event != "call":
            return
        code = frame.f_code
        for prefix, shown in self.roots.items():
            if code.co_filename.startswith(prefix):
                path = shown + code.co_filename[len(prefix) :]
                if not (path.startswith("epd/v1/") or _is_expression(code.co_qualname)):
                    self.calls.add((path, code.co_qualname))
                return


def _is_expression(qualname: str) -> bool:
    """Whether ``qualname`` names a comprehension, generator expression or lambda, which run as
    code objects of their own but are read as part of their function."""
    return qualname.rsplit(".", 1)[-1].startswith("<")


def _folder(module: str) -> Path:
    """The folder of package ``module`` as imported (an editable install maps each apart)."""
    return Path(importlib.import_module(module).__file__ or "").parent


def picture_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


async def stream_one(session: aiohttp.ClientSession, base_url: str, seed: int) -> int:
    """Stream one chat with a picture through the OpenAI door; returns the chunks received."""
    body = {
        "model": "tiny",
        "max_tokens": 4,
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": picture_url(seed)}},
                    {"type": "text", "text": "What is in this picture?"},
                ],
            }
        ],
    }
    num_chunks = 0
    async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            num_chunks += line.startswith(b"data: {")
    return num_chunks


async def walk(recorder: CallRecorder, base_url: str) -> set[Call]:
    """The functions each of three requests ran (each with a picture of its own)."""
    walks = []
    async with aiohttp.ClientSession() as session:
        await stream_one(session, base_url, 0)  # NOTE: warm-up: first-call work is not the path
        for seed in (1, 2, 3):
            recorder.calls = set()
            recorder.is_recording = True
            try:
                await stream_one(session, base_url, seed)
            finally:
                recorder.is_recording = False
            walks.append(recorder.calls)
    return set.intersection(*walks)


@contextlib.asynccontextmanager
async def e_p_d(model_dir: Path, producer: Any, consumer: Any) -> AsyncIterator[str]:
    """E/P/D in this process around two started vLLM engines (KV producer and consumer); yields
    the route's HTTP base URL once every worker is registered."""
    from epd.common.channels import create_channel
    from epd.common.roles import Role
    from epd.scheduler.app import build_scheduler_server
    from epd.server.decode.app import DecodeConfig, build_decode_server
    from epd.server.encode.app import EncodeConfig, build_encode_server
    from epd.server.prefill.app import PrefillConfig, build_prefill_server
    from epd.server.route.app import RouteConfig, build_route_server
    from epd.v1 import scheduler_service_pb2 as scheduler_pb
    from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc

    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    encoder = await build_encode_server(
        EncodeConfig(model_dir, model_id="tiny", scheduler=endpoint)
    )
    prefill = await build_prefill_server(
        PrefillConfig(model_dir, mode=Role.PREFILL, scheduler=endpoint), producer
    )
    decode = await build_decode_server(DecodeConfig(scheduler=endpoint), consumer)
    route = await build_route_server(RouteConfig(model_dir, endpoint, "tiny", http_port=0))
    try:
        async with create_channel(endpoint) as channel:
            stub = scheduler_grpc.SchedulerServiceStub(channel)
            for _ in range(200):
                if len((await stub.ListWorkers(scheduler_pb.ListWorkersRequest())).workers) == 3:
                    break
                await asyncio.sleep(0.05)
        assert route.http is not None
        yield f"http://127.0.0.1:{route.http.port}"
    finally:
        await route.stop()
        for worker in (decode, prefill, encoder):
            await worker.stop()
        await scheduler.drain_and_stop(0)


def by_file(calls: set[Call]) -> dict[str, list[str]]:
    """The walk's functions grouped by file, both sorted."""
    files: dict[str, list[str]] = {}
    for path, name in sorted(calls):
        files.setdefault(path, []).append(name)
    return files


async def measure(model_dir: Path) -> set[Call]:
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

    def options(role: str) -> VllmOptions:
        return VllmOptions(kv_role=role, kv_cache_bytes=96 << 20, max_model_len=2048)

    recorder = CallRecorder()
    recorder.install()
    try:
        producer, consumer = await asyncio.gather(
            VllmEngine.start(model_dir, model_id="tiny", options=options("kv_producer")),
            VllmEngine.start(model_dir, model_id="tiny", options=options("kv_consumer")),
        )
        try:
            async with e_p_d(model_dir, producer, consumer) as base_url:
                return await walk(recorder, base_url)
        finally:
            await asyncio.gather(producer.close(), consumer.close())
    finally:
        recorder.uninstall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path(".epd/models/tiny"))
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    calls = asyncio.run(measure(args.model))
    files = by_file(calls)
    if args.json:
        print(json.dumps({"num_files": len(files), "num_functions": len(calls), "files": files}))
        return
    for path, names in files.items():
        print(f"{path} ({len(names)}): {', '.join(names)}")
    print(f"\n{len(files)} files, {len(calls)} functions")


if __name__ == "__main__":
    main()
