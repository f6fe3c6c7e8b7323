"""A local HTTP server for fetch tests: an image, a slow route, a huge body, redirects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def image_server(body: bytes, *, slow_s: float = 5.0) -> AsyncIterator[str]:
    """Serve on 127.0.0.1 (free port); yields the base URL. Routes: /image.png, /slow,
    /huge (2 MiB of zeros), /redirect?to=URL."""

    async def image(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="image/png")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(slow_s)
        return web.Response(body=body)

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=b"\0" * (2 << 20))

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    app = web.Application()
    app.add_routes(
        [
            web.get("/image.png", image),
            web.get("/slow", slow),
            web.get("/huge", huge),
            web.get("/redirect", redirect),
        ]
    )
    runner = web.AppRunner(app, shutdown_timeout=0.1)  # NOTE: ends /slow calls still sleeping
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
