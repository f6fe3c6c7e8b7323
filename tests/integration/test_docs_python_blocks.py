"""Every python block of README.md and docs/ compiles, every ``import`` / ``from ... import``
resolves, and the block runs in a subprocess; the ones talking to a deployment at 127.0.0.1 (the
SDK, the ``openai`` client) reach a real route over in-memory fakes, with these placeholders
swapped for what it serves: ``127.0.0.1:50050`` is the route's gRPC endpoint,
``http://127.0.0.1:PORT`` (or any port) its OpenAI HTTP endpoint, ``base64,...`` a PNG, an
``https://example.com/...`` image a PNG (no network here), and quoted ``NAME.png`` /
``NAME.jpg`` files are written into the block's working folder."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from PIL import Image

from tests.integration.doc_blocks import PYTHON, Block, by_place, import_problems

T = TypeVar("T")


@by_place(PYTHON)
def test_python_blocks_compile_and_their_imports_resolve(block: Block) -> None:
    assert import_problems(block.code) == [], block.where


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


class RouteThread:
    """The real route (gRPC and OpenAI HTTP) over fakes, on an event loop in its own thread so
    that blocks calling ``asyncio.run`` or blocking clients can drive it."""

    def __init__(self, model_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.endpoint, self.http_url = self.call(self._start(model_dir))

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    async def _start(self, model_dir: Path) -> tuple[str, str]:
        from epd.common.server import ServerOptions
        from epd.server.media.policy import MediaPolicy
        from epd.server.media.video_loader import VideoLoader
        from epd.server.media.video_planner import VideoPlanner
        from epd.server.route.openai_http import OpenAiHttp
        from epd.server.route.tools import ToolOptions
        from tests.unit.route.fake_route import serve_route
        from tests.unit.route.fakes import FakePeers

        # NOTE: as README's deployment: --enable-auto-tool-choice --tool-call-parser hermes
        tools = ToolOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
        served = await serve_route(model_dir, FakePeers(), " a red square", ServerOptions(), tools)
        # NOTE: the blocks' videos are decoded and planned for real; the fake encoders take them
        served.router.videos = VideoLoader(VideoPlanner(model_dir, "tiny"), MediaPolicy())
        self.server = served.server
        self.http = OpenAiHttp(served.router, tools=served.calling)
        http_port = await self.http.start("127.0.0.1", 0)
        return f"127.0.0.1:{served.port}", f"http://127.0.0.1:{http_port}"

    async def _stop(self) -> None:
        await self.http.stop()
        await self.server.drain_and_stop(0)

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def route(tiny_model_dir: Path) -> Iterator[RouteThread]:
    route = RouteThread(tiny_model_dir)
    yield route
    route.stop()


def with_placeholders_filled(code: str, route: RouteThread) -> str:
    picture = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    code = re.sub(r"http://127\.0\.0\.1:(PORT|\d+)", route.http_url, code)
    code = code.replace("127.0.0.1:50050", route.endpoint)
    code = code.replace("data:image/png;base64,...", picture)
    return re.sub(r"https://example\.com/[\w./-]+", picture, code)


@by_place(PYTHON)
def test_python_blocks_run(block: Block, route: RouteThread, tmp_path: Path) -> None:
    for name in set(re.findall(r"[\"']([\w-]+\.(?:png|jpg))[\"']", block.code)):
        (tmp_path / name).write_bytes(png_bytes())
    environment = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", with_placeholders_filled(block.code, route)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stderr[-3000:]}"
