"""``bench_soak.py``'s reading of a stream, against an in-process HTTP server that answers as the
route does or breaks as a dying one would: each break is a failed or corrupted request."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.unit.scripts.loader import load

soak_load = load("soak_load")
check = load("soak_check")
TOKENS = 3
REFERENCE = ["a", "b", "c"]


def event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def delta(text: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": text}}]})


def usage(tokens: int) -> bytes:
    return event({"choices": [], "usage": {"completion_tokens": tokens}})


DONE = b"data: [DONE]\n\n"
STREAMS = {
    "whole": [delta(""), delta("a"), delta("b"), delta("c"), usage(3), DONE],
    "repeated": [delta("a"), delta("b"), delta("b"), delta("c"), usage(3), DONE],
    "missing": [delta("a"), delta("c"), usage(3), DONE],
    "miscounted": [delta("a"), delta("b"), delta("c"), usage(4), DONE],
    "error_event": [delta("a"), event({"error": {"message": "decode died"}}), DONE],
    "cut": [delta("a"), delta("b")],
}


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body["model"] == "refused":
        return web.json_response({"error": {"message": "no worker"}}, status=503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in STREAMS[body["model"]]:
        await response.write(chunk)
    await response.write_eof()
    return response


def app() -> web.Application:
    application = web.Application()
    application.router.add_post("/v1/chat/completions", chat)
    return application


@pytest.mark.parametrize(
    ("model", "status", "detail"),
    [
        ("whole", "ok", ""),
        ("repeated", "corrupted", "repeated from piece 2"),
        ("missing", "corrupted", "missing from piece 1"),
        ("miscounted", "corrupted", "usage says 4 tokens, not 3"),
        ("error_event", "failed", "error event"),
        ("cut", "failed", "no [DONE]"),
        ("refused", "failed", "HTTP 503"),
    ],
)
async def test_each_break_of_a_stream_is_a_failed_or_corrupted_request(
    model: str, status: str, detail: str
) -> None:
    async with TestServer(app()) as server, aiohttp.ClientSession() as session:
        url = str(server.make_url("/v1"))
        answer = await soak_load.stream_chat(session, url, {"model": model}, timeout_s=10)
    judged = soak_load.judge(answer, REFERENCE, TOKENS)
    assert judged[0] == status
    assert judged[1].startswith(detail)


async def test_a_refused_connection_is_a_failed_request() -> None:
    async with aiohttp.ClientSession() as session:
        answer = await soak_load.stream_chat(session, "http://127.0.0.1:9/v1", {}, timeout_s=5)
    assert soak_load.judge(answer, REFERENCE, TOKENS)[0] == "failed"
    assert "ClientConnectorError" in answer.error


async def test_kills_fire_one_at_a_time_after_their_request_number() -> None:
    events: list[str] = []

    def fire(kill: Any) -> Any:
        events.append(f"fire {kill.role}")
        return soak_load.Fired(kill, kill.role, 1, 0.0)

    async def healed(fired: Any) -> None:
        events.append(f"healed {fired.service}")

    kills = (check.Kill("prefill", 6), check.Kill("encoder", 5), check.Kill("decode", 99))
    options = soak_load.LoadOptions(20, 4, 10.0, kills)
    body = {"model": "whole", "max_tokens": TOKENS}
    async with TestServer(app()) as server, aiohttp.ClientSession() as session:
        url = str(server.make_url("/v1"))
        chaos = soak_load.Chaos(fire, healed)
        outcomes, fired = await soak_load.drive(session, url, [body], [REFERENCE], options, chaos)
    assert [o.status for o in outcomes] == ["ok"] * 20
    assert events == ["fire encoder", "healed encoder", "fire prefill"]
    assert [f.kill.role for f in fired] == ["encoder", "prefill"]
