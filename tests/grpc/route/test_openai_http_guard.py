"""The OpenAI HTTP port's defences: bearer token, HTTPS (and client certificates), body limits,
header and idle timeouts, the connection cap. Each test runs the real port in-process."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epd.common.http_tracing import tracing_middleware
from epd.common.server_tls import ServerTls
from epd.server.route import openai_http
from epd.server.route.http_guard import HttpOptions, count_json_values
from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.router import RouteChunk
from epd.v1 import generation_pb2, route_service_pb2
from tests.grpc.common.servicers import self_signed_cert

CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
TOKEN = "s3cret-token"


class EchoWorker:
    """A Router stand-in answering 'ok'."""

    model_id = "tiny"

    def __init__(self) -> None:
        self.requests: list[route_service_pb2.GenerateRequest] = []

    async def generate(
        self, request: route_service_pb2.GenerateRequest, timeout_s: float | None = None
    ) -> AsyncIterator[RouteChunk]:
        self.requests.append(request)
        usage = generation_pb2.Usage(prompt_tokens=1, completion_tokens=1)
        yield RouteChunk("ok", [1], generation_pb2.FINISH_REASON_STOP, usage)


async def started(options: HttpOptions) -> tuple[OpenAiHttp, str]:
    http = OpenAiHttp(EchoWorker(), options)  # type: ignore[arg-type]
    port = await http.start("127.0.0.1", 0)
    return http, f"{http.scheme}://127.0.0.1:{port}"


async def post(
    url: str,
    body: bytes | dict[str, object],
    headers: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, object]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/v1/chat/completions",
            data=io.BytesIO(data),
            ssl=ssl_context,
            headers={"Content-Type": "application/json", **(headers or {})},
        ) as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_without_the_token_chat_and_models_are_401_and_health_stays_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    http, url = await started(HttpOptions(auth_token=TOKEN))
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            status, body = await post(url, CHAT, headers)
            assert status == 401
            assert body["error"]["code"] == "invalid_api_key"  # type: ignore[index]
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/v1/models") as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"] == "Bearer"
            async with session.get(url + "/health") as response:
                assert response.status == 200
            async with session.get(url + "/version") as response:
                assert response.status == 200
                from epd import __version__

                assert (await response.json())["version"] == __version__
        status, body = await post(url, CHAT, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "ok"  # type: ignore[index]
    finally:
        await http.stop()
    assert TOKEN not in caplog.text


async def test_https_with_the_grpc_certificate_and_client_certificates(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path, "localhost")
    client_cert, client_key = self_signed_cert(tmp_path, "client")
    options = HttpOptions(tls=ServerTls(cert, key, client_cert))
    http, url = await started(options)
    assert url.startswith("https://")
    url = url.replace("127.0.0.1", "localhost")
    try:
        trusting = ssl.create_default_context(cafile=cert)
        with pytest.raises(aiohttp.ClientError):
            await post(url, CHAT, ssl_context=trusting)
        trusting.load_cert_chain(client_cert, client_key)
        status, _ = await post(url, CHAT, ssl_context=trusting)
        assert status == 200
        with pytest.raises(aiohttp.ClientError):
            await post(url.replace("https:", "http:"), CHAT)
    finally:
        await http.stop()


async def test_a_body_over_the_limit_is_413_and_never_parsed() -> None:
    http, url = await started(HttpOptions(max_body_bytes=1 << 20))
    try:
        big = dict(CHAT, messages=[{"role": "user", "content": "x" * (2 << 20)}])
        status, body = await post(url, big)
        assert status == 413
        assert body["error"]["code"] == "body_too_large"  # type: ignore[index]
    finally:
        await http.stop()


async def test_a_large_body_is_parsed_and_judged_off_the_event_loop_as_a_small_one() -> None:
    """Over ``INLINE_PARSE_BYTES`` the body is parsed and converted in a thread: the same answer,
    and a refusal the conversion raises there is the same 400 naming the field."""
    from epd.server.route.http_guard import INLINE_PARSE_BYTES

    http, url = await started(HttpOptions())
    try:
        text = "x " * INLINE_PARSE_BYTES
        large = dict(CHAT, messages=[{"role": "user", "content": text}])
        status, body = await post(url, large)
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "ok"  # type: ignore[index]
        status, body = await post(url, dict(large, temperature=-1))
        assert status == 400
        assert body["error"]["param"] == "temperature"  # type: ignore[index]
    finally:
        await http.stop()


@pytest.mark.parametrize(
    "filler",
    [b"[],", b"{},", b"1,"],
    ids=["arrays", "objects", "numbers"],
)
async def test_a_body_of_millions_of_small_values_is_refused_before_parsing(filler: bytes) -> None:
    http, url = await started(HttpOptions(max_json_values=10_000))
    try:
        body = b'{"metadata": [' + filler * 2_000_000 + b'1], "messages": []}'
        status, answer = await post(url, body)
        assert status == 400
        assert answer["error"]["code"] == "body_too_complex"  # type: ignore[index]
    finally:
        await http.stop()


async def test_json_nested_100000_deep_is_400() -> None:
    http, url = await started(HttpOptions())
    try:
        status, answer = await post(url, b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        assert status == 400
        assert answer["error"]["param"] == "body"  # type: ignore[index]
    finally:
        await http.stop()


def test_value_count_ignores_separators_inside_strings() -> None:
    text = json.dumps({"messages": [{"role": "user", "content": "a, b, [c], {d}" * 1000}]})
    assert count_json_values(text.encode(), limit=10) == 5
    assert count_json_values(b"[1, 2, 3]", limit=10) == 4
    strings = b"[" + b'"a", ' * 100 + b"1]"
    assert count_json_values(strings, limit=10) > 10
    assert count_json_values(strings, limit=1000) <= 1000


async def raw_connection(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def test_slow_headers_are_cut_off_with_408() -> None:
    http, url = await started(HttpOptions(header_timeout_s=0.3, idle_timeout_s=30))
    try:
        reader, writer = await raw_connection(url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - start < 3
        writer.close()
    finally:
        await http.stop()


async def test_idle_connections_are_closed_and_a_kept_alive_one_still_serves() -> None:
    http, url = await started(HttpOptions(idle_timeout_s=0.5, header_timeout_s=5))
    try:
        reader, writer = await raw_connection(url)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.get(url + "/health") as response:
                    assert response.status == 200
    finally:
        await http.stop()


async def test_connections_over_the_cap_are_answered_503_and_closed() -> None:
    http, url = await started(HttpOptions(max_connections=3, idle_timeout_s=30))
    held = []
    try:
        for _ in range(3):
            held.append(await raw_connection(url))
        reader, writer = await raw_connection(url)
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 503")
        writer.close()
        for _, held_writer in held:
            held_writer.close()
        await asyncio.sleep(0.2)
        async with aiohttp.ClientSession() as session, session.get(url + "/health") as response:
            assert response.status == 200
    finally:
        await http.stop()


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        HttpOptions(max_connections=0)
    with pytest.raises(ValueError, match="certificate and a key"):
        HttpOptions(tls=ServerTls(cert_file="cert.pem"))


@pytest.mark.parametrize("traced", [False, True])
async def test_requests_get_a_server_span_only_where_spans_are_exported(
    traced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_http, "traces_rpcs", lambda: traced)
    http, url = await started(HttpOptions())
    try:
        assert http._runner is not None
        assert (tracing_middleware in http._runner.app.middlewares) is traced
        assert (await post(url, CHAT))[0] == 200
    finally:
        await http.stop()
