"""A real route whose scheduler cannot be reached: ListModels over gRPC and /v1/models over HTTP
answer UNAVAILABLE (503), a chat answers UNAVAILABLE too; nothing is INTERNAL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epd.client import AsyncEpdClient, user
from epd.client.errors import Unavailable
from epd.launch.free_ports import free_port
from epd.server.route.app import RouteApp, RouteConfig, build_route_server


@pytest.fixture
async def route(tiny_model_dir: Path) -> AsyncIterator[RouteApp]:
    config = RouteConfig(tiny_model_dir, f"127.0.0.1:{free_port()}", "tiny", http_port=0)
    app = await build_route_server(config)
    yield app
    await app.stop()


async def test_list_models_is_unavailable(route: RouteApp) -> None:
    async with AsyncEpdClient(f"127.0.0.1:{route.port}") as client:
        with pytest.raises(Unavailable) as caught:
            await client.list_models()
    assert caught.value.code == "UNAVAILABLE"


async def test_http_models_is_503(route: RouteApp) -> None:
    assert route.http is not None
    url = f"http://127.0.0.1:{route.http.port}/v1/models"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body = await response.json()
    assert response.status == 503, body
    assert body["error"]["type"] == "server_error"


async def test_a_chat_is_unavailable(route: RouteApp) -> None:
    async with AsyncEpdClient(f"127.0.0.1:{route.port}") as client:
        with pytest.raises(Unavailable):
            await client.generate([user("hi")], timeout_s=10)
