"""URL loading from a local HTTP server: fetches, the SSRF guard on loopback and on every
redirect hop, size limits, timeouts, and the loader's de-duplication."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator

import pytest

from epd.common.errors import InvalidArgument
from epd.server.media import fetch
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from tests.grpc.media.web import image_server
from tests.unit.media.test_fetch import GUARDED, OPEN, PNG, reason_of


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async with image_server(PNG) as url:
        yield url


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


async def test_a_tab_in_a_url_is_not_stripped_and_fetched(server: str) -> None:
    assert await reason_of(f"{server}/image\t.png", OPEN) == "BAD_URL"
    assert await reason_of(f"{server}/image.png\r\n", OPEN) == "BAD_URL"
