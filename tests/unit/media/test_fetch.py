"""URL loading: data/file URLs, the SSRF guard, limits and the loader's cache (fetches from a
local server: tests/grpc/media/test_fetch_server.py)."""

from __future__ import annotations

import asyncio
import base64
import urllib.parse

import pytest

from epd.common.errors import InvalidArgument
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


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x.png",
        "http://[::1]/x.png",
        "http://169.254.169.254/latest",
        "http://10.0.0.1/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0x7f000001/x",
        "http://2130706433/x",
        "http://localhost/x",
    ],
)
async def test_private_and_loopback_addresses_are_refused(url: str) -> None:
    assert await reason_of(url, GUARDED) == "PRIVATE_ADDRESS"


@pytest.mark.parametrize(
    "head", ["DATA:IMAGE/PNG;BASE64", "data:image/png;BASE64", "Data:Image/Png;Base64"]
)
async def test_a_data_urls_scheme_and_parameters_are_read_in_any_case(head: str) -> None:
    """RFC 2397 (and RFC 2045's media types) read them case-insensitively; ``;BASE64`` was read
    as percent-encoded bytes and the image refused as bad."""
    assert await fetch.fetch_url(f"{head}," + base64.b64encode(PNG).decode(), GUARDED) == PNG


async def test_an_upper_case_data_url_loads_as_its_lower_case_twin() -> None:
    loader = MediaLoader(GUARDED, model_id="m", processor_fingerprint="p")
    payload = base64.b64encode(PNG).decode()
    lower = await loader.load(url="data:image/png;base64," + payload)
    upper = await loader.load(url="DATA:IMAGE/PNG;BASE64," + payload)
    assert upper.mm_hash == lower.mm_hash


async def test_unsupported_schemes_are_refused() -> None:
    assert await reason_of("ftp://example.com/x.png", GUARDED) == "UNSUPPORTED_SCHEME"
    assert await reason_of("x.png", GUARDED) == "UNSUPPORTED_SCHEME"


async def test_cache_keeps_decoded_images_under_a_byte_budget() -> None:
    loader = MediaLoader(GUARDED, model_id="m", processor_fingerprint="p", cache_bytes=64 * 48 * 3)
    first, second = encode(noise(seed=1)), encode(noise(seed=2))
    await loader.load(data=first)
    await loader.load(data=second)
    assert len(loader.cache) == 1 and loader.cache.num_bytes == 64 * 48 * 3
    await loader.load(data=second)
    await loader.load(data=first)
    assert loader.cache.num_loads == 3 and loader.cache.num_hits == 1
    big = MediaLoader(GUARDED, model_id="m", processor_fingerprint="p", cache_bytes=100)
    await big.load(data=first)
    assert len(big.cache) == 0


async def test_a_failed_load_is_shared_and_not_cached() -> None:
    """A load that fails decoding (a truncated image, large enough to decode in a thread) is
    shared by concurrent callers and not cached; bytes no format opens fail before any load."""
    loader = MediaLoader(GUARDED, model_id="m", processor_fingerprint="p")
    truncated = encode(noise(400, 300))[:400]
    outcomes = await asyncio.gather(
        *(loader.load(data=truncated) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, InvalidArgument) for o in outcomes)
    assert loader.cache.num_loads == 1 and len(loader.cache) == 0
    with pytest.raises(InvalidArgument):
        await loader.load(data=truncated)
    assert loader.cache.num_loads == 2
    with pytest.raises(InvalidArgument) as caught:
        await loader.load(data=b"junk")
    assert caught.value.reason == "BAD_IMAGE" and loader.cache.num_loads == 2


@pytest.fixture
def no_network(monkeypatch) -> list[str]:
    """Records (instead of making) every lookup and fetch the URL code attempts."""
    attempts: list[str] = []

    async def fetch_http(url: str, policy: MediaPolicy) -> bytes:
        attempts.append(url)
        raise AssertionError(f"connection attempted for {url!r}")

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        attempts.append(str(host))
        raise AssertionError(f"lookup attempted for {host!r}")

    monkeypatch.setattr(fetch, "_fetch_http", fetch_http)
    monkeypatch.setattr(fetch.socket, "getaddrinfo", getaddrinfo)
    return attempts


@pytest.mark.parametrize("char", ["\r", "\n", "\t", "\0", "\x1b", "\x7f", " ", "\x85", "\u2028"])
@pytest.mark.parametrize("where", ["host", "path"])
async def test_urls_with_whitespace_or_control_chars_are_refused_unfetched(
    char: str, where: str, no_network: list[str]
) -> None:
    url = (
        f"http://exa{char}mple.com/x.png" if where == "host" else f"http://example.com/x{char}.png"
    )
    assert await reason_of(url, OPEN) == "BAD_URL"
    assert await reason_of(url.replace("http://example.com", "file://"), OPEN) == "BAD_URL"
    assert no_network == []


async def test_long_urls_are_refused_unfetched(no_network: list[str]) -> None:
    policy = MediaPolicy(allow_private_networks=True, max_url_chars=100)
    assert await reason_of("http://example.com/" + "x" * 82, policy) == "BAD_URL"
    assert await reason_of("http://example.com/" + "x" * 8200, OPEN) == "BAD_URL"
    assert no_network == []


async def test_data_urls_are_bounded_by_bytes_not_by_the_url_limit() -> None:
    policy = MediaPolicy(max_url_chars=100, max_bytes=1 << 20)
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert len(url) > 100 and await fetch.fetch_url(url, policy) == PNG
    assert await reason_of("data:image/png;x=" + "y" * 100 + ";base64,AAAA", policy) == "BAD_URL"
    for bad in ("\n", " ", "\t"):
        wrapped = url[:80] + bad + url[80:]
        assert await reason_of(wrapped, policy) == "BAD_URL"
        assert await reason_of("data:," + bad + "abc", policy) == "BAD_URL"
    assert await reason_of("data:image/png;base64,@@@@", policy) == "BAD_DATA_URL"


async def test_data_urls_are_not_kept_alive_after_loading() -> None:
    """urllib.parse.urlsplit caches its last 128 results; a data: URL split there stayed alive
    with its payload (the route held up to 128 images' worth of data URLs)."""
    urllib.parse.urlsplit.cache_clear()
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert await fetch.fetch_url(url, GUARDED) == PNG
    assert await reason_of("data:image/png;base64,@@@", GUARDED) == "BAD_DATA_URL"
    assert urllib.parse.urlsplit.cache_info().currsize == 0


@pytest.mark.parametrize(
    "url", ["data:,x", "DATA:,x", "HTTP://a/b", "ftp://a", "c:/x", "1a:b", ":x", "x", "é:x"]
)
def test_url_scheme_reads_as_urlsplit_does(url: str) -> None:
    assert fetch.url_scheme(url) == urllib.parse.urlsplit(url).scheme.lower()


BASE64_TEXTS = [
    "",
    "QUJD",
    "QUI=",
    "QQ==",
    "QUJD====",
    "QUJDRA==QUJD",
    "QQ=A",
    "QQ",
    "Q",
    "====",
    "QU JD",
    "QUJD\n",
    "é",
    base64.b64encode(PNG).decode(),
]


@pytest.mark.parametrize("text", BASE64_TEXTS)
def test_data_url_payloads_decode_and_fail_as_the_standard_decoder(text: str) -> None:
    """A base64 payload is decoded by the fast decoder (pybase64) as base64.b64decode with
    validate decodes it: the same bytes, or the same refusal with base64's own words (pybase64
    alone refuses excess padding, and names every refusal 'Non-base64 digit found')."""
    try:
        expected: bytes | str = base64.b64decode(text, validate=True)
    except ValueError as e:
        clean = fetch.is_clean(text)
        expected = f"data URL is not valid base64: {e}" if clean else "BAD_URL"
    try:
        got: bytes | str = fetch.decode_data_url("data:image/png;base64," + text, GUARDED)
    except InvalidArgument as e:
        got = e.message if e.reason == "BAD_DATA_URL" else e.reason
    assert got == expected
