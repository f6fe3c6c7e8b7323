"""URL loading: data/file URLs, the SSRF guard, redirects, limits and timeouts."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from epd.server.common.errors import InvalidArgument
from epd.server.media import fetch
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from tests.unit.media.images import encode, noise

PNG = encode(noise())
OPEN = MediaPolicy(allow_private_networks=True, fetch_timeout_s=2.0, max_bytes=1 << 20)
GUARDED = MediaPolicy(fetch_timeout_s=2.0)


async def reason_of(url: str, policy: MediaPolicy) -> str:
    with pytest.raises(InvalidArgument) as caught:
        await fetch.fetch_url(url, policy)
    return caught.value.reason


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def image(request: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(body=PNG)

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=b"\0" * (2 << 20))

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    app = web.Application()
    app.add_routes([web.get("/image.png", image), web.get("/slow", slow), web.get("/huge", huge),
                    web.get("/redirect", redirect)])  # fmt: skip
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_data_url_and_its_errors() -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert await fetch.fetch_url(url, GUARDED) == PNG
    assert await reason_of("data:image/png;base64,@@@", GUARDED) == "BAD_DATA_URL"
    assert await reason_of("data:image/png;base64", GUARDED) == "BAD_DATA_URL"


async def test_file_urls_only_when_allowed(tmp_path) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(PNG)
    assert await reason_of(f"file://{path}", GUARDED) == "LOCAL_FILES_FORBIDDEN"
    assert await fetch.fetch_url(f"file://{path}", MediaPolicy(allow_local_files=True)) == PNG
    missing = MediaPolicy(allow_local_files=True)
    assert await reason_of(f"file://{tmp_path}/none.png", missing) == "FILE_UNREADABLE"


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/x.png", "http://[::1]/x.png", "http://169.254.169.254/latest",
    "http://10.0.0.1/x", "http://[::ffff:127.0.0.1]/x", "http://0x7f000001/x",
    "http://2130706433/x", "http://localhost/x",
])  # fmt: skip
async def test_private_and_loopback_addresses_are_refused(url: str) -> None:
    assert await reason_of(url, GUARDED) == "PRIVATE_ADDRESS"


async def test_unsupported_schemes_are_refused() -> None:
    assert await reason_of("ftp://example.com/x.png", GUARDED) == "UNSUPPORTED_SCHEME"
    assert await reason_of("x.png", GUARDED) == "UNSUPPORTED_SCHEME"


async def test_fetch_from_a_local_server_when_allowed(server: str) -> None:
    assert await fetch.fetch_url(f"{server}/image.png", OPEN) == PNG
    assert await reason_of(f"{server}/image.png", GUARDED) == "PRIVATE_ADDRESS"
    assert await reason_of(f"{server}/missing", OPEN) == "FETCH_FAILED"
    assert await reason_of(f"{server}/huge", OPEN) == "IMAGE_TOO_LARGE"


async def test_slow_servers_time_out(server: str) -> None:
    policy = MediaPolicy(allow_private_networks=True, fetch_timeout_s=0.3)
    assert await reason_of(f"{server}/slow", policy) == "FETCH_TIMEOUT"


async def test_every_redirect_hop_is_checked(server: str, monkeypatch) -> None:
    trusted = ipaddress.ip_address("127.0.0.1")
    monkeypatch.setattr(fetch, "is_public", lambda address: address == trusted)
    assert await fetch.fetch_url(f"{server}/redirect?to=/image.png", GUARDED) == PNG
    port = server.rsplit(":", 1)[1]
    hop = f"{server}/redirect?to=http://127.0.0.2:{port}/image.png"
    assert await reason_of(hop, GUARDED) == "PRIVATE_ADDRESS"


async def test_loader_deduplicates_and_caches(server: str) -> None:
    loader = MediaLoader(OPEN, model_id="m", processor_fingerprint="p")
    loaded = await asyncio.gather(*(loader.load(url=f"{server}/image.png") for _ in range(5)))
    assert len({item.mm_hash for item in loaded}) == 1 and loader.cache.num_loads == 1
    same = await loader.load(data=PNG)
    assert same.mm_hash == loaded[0].mm_hash
    with pytest.raises(InvalidArgument):
        await loader.load()
