"""Bring image bytes in from a URL: data:, file: (only when allowed), http(s) with an SSRF guard.

The guard resolves host names itself and lets the connection use only addresses it checked, so a
name cannot resolve to a public address when checked and to a private one when connected. IP
literals (any spelling getaddrinfo accepts) are checked the same way, and redirects are followed
by hand so every hop is checked again. Responses are read under the byte limit; the whole fetch,
redirects included, is under the time limit.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import socket
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp
import pybase64
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_SCHEME_CHARS = frozenset(urllib.parse.scheme_chars)
# NOTE: ASCII control characters and space, for bytes.translate: str.isprintable also catches
# the non-ASCII ones but is several times slower on a long (data:) URL.
_CONTROL_OR_SPACE = bytes(range(0x21)) + b"\x7f"


def _refuse(message: str, reason: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason)


def is_public(address: IpAddress) -> bool:
    """True for globally routable unicast addresses (IPv4-mapped IPv6 judged as IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class BlockedAddressError(OSError):
    """The host resolves only to addresses the policy forbids."""


class GuardedResolver(AbstractResolver):
    """Resolves with getaddrinfo and drops every address that is not public."""

    def __init__(self) -> None:
        self._inner = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if is_public(ipaddress.ip_address(r["host"]))]
        if not allowed:
            raise BlockedAddressError(f"{host} resolves to a private or reserved address")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


async def fetch_url(url: str, policy: MediaPolicy) -> bytes:
    """The bytes behind ``url`` (data:, file:, http:, https:) under ``policy``."""
    scheme = url_scheme(url)
    if scheme == "data":
        return decode_data_url(url, policy)
    check_url(url, policy)
    if scheme == "file":
        return read_file_url(url, policy)
    if scheme in ("http", "https"):
        try:
            return await asyncio.wait_for(_fetch_http(url, policy), policy.fetch_timeout_s)
        except TimeoutError:
            raise _refuse(
                f"fetching {url} took longer than {policy.fetch_timeout_s:g}s", "FETCH_TIMEOUT"
            ) from None
    raise _refuse(
        f"unsupported URL scheme {scheme or '(none)'!r}: use http(s), data or file",
        "UNSUPPORTED_SCHEME",
    )


def url_scheme(url: str) -> str:
    """The scheme of ``url`` as ``urllib.parse.urlsplit`` reads it, lowercased ('' for none).

    Not through ``urlsplit`` itself: it keeps its last 128 results, and for data: URLs those
    would keep the payloads of the last 128 images alive (up to ~27 MB each at the default byte
    limit, twice over: the URL and its split path).
    """
    colon = url.find(":")
    head = url[:colon] if colon > 0 else ""
    if head[:1].isascii() and head[:1].isalpha() and all(c in _SCHEME_CHARS for c in head):
        return head.lower()
    return ""


def decode_data_url(url: str, policy: MediaPolicy) -> bytes:
    """Payload of a ``data:[<mime>][;base64],<data>`` URL (scheme, media type and ``;base64``
    in any case, as RFC 2397 reads them). Its header is checked as ``check_url`` checks a URL;
    its payload is bounded by the byte limit instead, and checked as it is decoded."""
    header, sep, payload = url[5:].partition(",")
    check_url(url[: 5 + len(header)], policy, "data URL header" if sep else "URL")
    if not sep:
        raise _refuse("data URL has no ',' before its payload", "BAD_DATA_URL")
    if len(payload) * 3 // 4 > policy.max_bytes:
        raise _refuse(f"data URL payload exceeds {policy.max_bytes} bytes", "IMAGE_TOO_LARGE")
    if not header.lower().endswith(";base64"):
        if not is_clean(payload):
            raise _bad_characters()
        return urllib.parse.unquote_to_bytes(payload)
    # NOTE: vLLM's SIMD decoder first; it refuses a few texts base64 takes (excess padding) and
    # names every refusal alike, so a refusal is base64's to decode or to name.
    with contextlib.suppress(binascii.Error, ValueError):
        return pybase64.b64decode(payload, validate=True)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        if not is_clean(payload):
            raise _bad_characters() from e
        raise _refuse(f"data URL is not valid base64: {e}", "BAD_DATA_URL") from e


def check_url(url: str, policy: MediaPolicy, what: str = "URL") -> None:
    """Refuse, before any I/O, a URL (or the part of one ``what`` names) over the length limit
    or with whitespace or control characters (urllib would quietly strip them and fetch
    another URL)."""
    if len(url) > policy.max_url_chars:
        raise _refuse(
            f"{what} is {len(url)} characters, the limit is {policy.max_url_chars}; "
            "send a large image as bytes or a data: URL",
            "BAD_URL",
        )
    if not is_clean(url):
        raise _bad_characters()


def is_clean(text: str) -> bool:
    """True if ``text`` has no whitespace and no control character (ASCII or other)."""
    if text.isascii():
        raw = text.encode("ascii")
        return len(raw.translate(None, _CONTROL_OR_SPACE)) == len(raw)
    return text.isprintable() and " " not in text


def _bad_characters() -> InvalidArgument:
    return _refuse(
        "URL contains whitespace or control characters (CR, LF, TAB, NUL, ...); "
        "percent-encode them",
        "BAD_URL",
    )


def read_file_url(url: str, policy: MediaPolicy) -> bytes:
    """Contents of a ``file:`` URL, only when the policy allows local files."""
    if not policy.allow_local_files:
        raise _refuse(
            "file: URLs are not allowed on this server (--allow-local-files)",
            "LOCAL_FILES_FORBIDDEN",
        )
    path = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    try:
        size = path.stat().st_size
        if size > policy.max_bytes:
            raise _refuse(
                f"{path} is {size} bytes, the limit is {policy.max_bytes}", "IMAGE_TOO_LARGE"
            )
        return path.read_bytes()
    except OSError as e:
        raise _refuse(f"cannot read {path}: {e.strerror or e}", "FILE_UNREADABLE") from e


def _check_literal_host(url: str, policy: MediaPolicy) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refuse(f"cannot fetch {url!r}: only http(s) URLs with a host", "UNSUPPORTED_SCHEME")
    address = _literal_address(parts.hostname)
    if address is not None and not policy.allow_private_networks and not is_public(address):
        raise _refuse(f"{parts.hostname} is a private or reserved address", "PRIVATE_ADDRESS")


def _literal_address(host: str) -> IpAddress | None:
    """``host`` as an IP address if it is one in any spelling (127.1, 0x7f000001, 2130706433)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


async def _fetch_http(url: str, policy: MediaPolicy) -> bytes:
    resolver: Any = None if policy.allow_private_networks else GuardedResolver()
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        for _ in range(policy.max_redirects + 1):
            check_url(url, policy)
            _check_literal_host(url, policy)
            try:
                async with session.get(url, allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308):
                        url = urllib.parse.urljoin(url, response.headers.get("Location", ""))
                        continue
                    if response.status != 200:
                        raise _refuse(
                            f"fetching {url} answered HTTP {response.status}", "FETCH_FAILED"
                        )
                    return await _read_limited(response, policy.max_bytes)
            except aiohttp.ClientConnectorError as e:
                if isinstance(e.os_error, BlockedAddressError):
                    raise _refuse(str(e.os_error), "PRIVATE_ADDRESS") from None
                raise _refuse(f"cannot connect to {url}: {e.os_error}", "FETCH_FAILED") from None
            except aiohttp.ClientError as e:
                raise _refuse(f"fetching {url} failed: {e}", "FETCH_FAILED") from None
    raise _refuse(f"more than {policy.max_redirects} redirects", "TOO_MANY_REDIRECTS")


async def _read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    declared = response.content_length
    if declared is not None and declared > limit:
        raise _refuse(f"image is {declared} bytes, the limit is {limit}", "IMAGE_TOO_LARGE")
    chunks, total = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        total += len(chunk)
        if total > limit:
            raise _refuse(f"image exceeds the limit of {limit} bytes", "IMAGE_TOO_LARGE")
        chunks.append(chunk)
    return b"".join(chunks)
