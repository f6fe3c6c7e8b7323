"""The proxy of vLLM's own disaggregated encoder (E+PD) split, for ``scripts/bench_e2e.py``'s
``vllm-ec`` system; it does what vLLM's example proxy (``examples/online_serving/
disaggregated_encoder/disagg_epd_proxy.py``) does for one encoder and one PD instance.

A chat completion with images goes first to the encode instance (``--ec-transfer-config``
``ec_producer``) as the same request with ``max_tokens`` 1 and no streaming, which stores the
images' encoder outputs (ECExampleConnector: files under a shared path, by mm_hash); then the
original request goes to the prefill+decode instance (``ec_consumer``), which loads them instead
of running its vision tower, and its answer (streamed or not) is relayed as it comes.

    .venv/bin/python scripts/vllm_ec_proxy.py --port P --encoder URL --prefill-decode URL
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
from aiohttp import web

MEDIA_PARTS = {"image_url", "audio_url", "input_audio"}


def has_media(body: dict[str, Any]) -> bool:
    """Whether any message of ``body`` has an image or audio part."""
    return any(
        isinstance(message.get("content"), list)
        and any(part.get("type") in MEDIA_PARTS for part in message["content"])
        for message in body.get("messages", [])
    )


def encoder_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request the encode instance gets: one token, not streamed."""
    request = {k: v for k, v in body.items() if k != "stream_options"}
    request.update(max_tokens=1, stream=False)
    if "max_completion_tokens" in request:
        request["max_completion_tokens"] = 1
    return request


def build_app(encoder: str, prefill_decode: str) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    sessions: dict[str, aiohttp.ClientSession] = {}

    async def open_session(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        sessions["http"] = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None)
        )

    async def close_session(app: web.Application) -> None:
        await sessions["http"].close()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        http = sessions["http"]
        if has_media(body):
            async with http.post(
                f"{encoder}/v1/chat/completions", json=encoder_request(body)
            ) as reply:
                if reply.status != 200:
                    return web.Response(status=reply.status, body=await reply.read())
                await reply.read()
        async with http.post(f"{prefill_decode}/v1/chat/completions", json=body) as reply:
            response = web.StreamResponse(
                status=reply.status,
                headers={"Content-Type": reply.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for chunk in reply.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def models(request: web.Request) -> web.Response:
        async with sessions["http"].get(f"{prefill_decode}/v1/models") as reply:
            return web.Response(status=reply.status, body=await reply.read())

    async def health(request: web.Request) -> web.Response:
        http = sessions["http"]
        for url in (encoder, prefill_decode):
            try:
                async with http.get(f"{url}/health") as reply:
                    if reply.status != 200:
                        return web.Response(status=503, text=f"{url} unhealthy")
            except aiohttp.ClientError:
                return web.Response(status=503, text=f"{url} unreachable")
        return web.Response(text="ok")

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--encoder", required=True, help="encode instance's base URL")
    parser.add_argument("--prefill-decode", required=True, help="PD instance's base URL")
    args = parser.parse_args()
    web.run_app(
        build_app(args.encoder, args.prefill_decode),
        host="127.0.0.1",
        port=args.port,
        print=None,
        loop=asyncio.new_event_loop(),
    )


if __name__ == "__main__":
    main()
