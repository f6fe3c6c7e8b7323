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
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
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
