"""OpenAI-compatible HTTP in the route process: /v1/chat/completions (with SSE streaming),
/v1/models and /health, served by aiohttp on its own port and driving the same Router as
gRPC, so the official ``openai`` client and OpenAI-speaking benchmarks work unchanged."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any

from aiohttp import web

from epd.common.errors import EpdError
from epd.common.http_tracing import tracing_middleware
from epd.server.route import openai_schema as schema
from epd.server.route.choices import generate_choices
from epd.server.route.http_guard import (
    GuardedSite,
    HttpError,
    HttpOptions,
    auth_middleware,
    read_json,
)
from epd.server.route.request import ChatRequest
from epd.server.route.request_check import RequestLimits
from epd.server.route.router import Router
from epd.v1 import generation_pb2

logger = logging.getLogger(__name__)


class OpenAiHttp:
    """The HTTP front of one Router."""

    def __init__(
        self,
        router: Router,
        options: HttpOptions | None = None,
        limits: RequestLimits | None = None,
        sampling_defaults: dict[str, Any] | None = None,
    ) -> None:
        """``options``: the port's limits, timeouts, token and TLS; ``limits``: what one
        chat-completions body may hold; ``sampling_defaults``: the model's default sampling
        values (``sampling.generation_defaults``), under a body's own."""
        self.router = router
        self.options = options or HttpOptions()
        self.limits = limits or RequestLimits()
        self.sampling_defaults = sampling_defaults or {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def scheme(self) -> str:
        """https when the port serves TLS, else http."""
        return "https" if self.options.tls_cert_file else "http"

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 picks a free port); returns the port."""
        middlewares = [tracing_middleware]
        if self.options.auth_token:
            middlewares.append(auth_middleware(self.options.auth_token))
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=middlewares)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/v1/models", self.models),
                web.get("/health", self.health),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = GuardedSite(self._runner, host, port, self.options)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        try:
            served = await self.router.list_models()
        except Exception as e:  # noqa: BLE001 - reported as an OpenAI error body
            return _error(e)
        models = sorted(set(served) | {self.router.model_id})
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "epd"} for m in models
                ],
            }
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            read = await read_json(request, self.options)
        except HttpError as e:
            return e.response()
        body = read.value
        convert = functools.partial(
            schema.to_chat_request,
            body,
            self.router.model_id,
            request.headers.get("X-Request-Id"),
            self.limits,
            self.sampling_defaults,
        )
        try:
            chat = await asyncio.to_thread(convert) if read.is_large else convert()
        except EpdError as e:
            return _error(e)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, chat, include_usage)
        answers = [schema.Answer() for _ in range(max(chat.sampling.n, 1))]
        try:
            choices = generate_choices(self.router, chat, self.options.request_timeout_s)
            async for choice in choices:
                answers[choice.index].add(choice.chunk)
        except Exception as e:  # noqa: BLE001 - reported as an OpenAI error body
            return _error(e)
        logprobs = [self._logprobs(chat, answer.positions) for answer in answers]
        return web.json_response(
            schema.completion(chat.request_id, chat.model, answers, logprobs),
            headers={"X-Request-Id": chat.request_id},
        )

    def _logprobs(
        self, chat: ChatRequest, positions: list[generation_pb2.TokenLogprobs]
    ) -> dict[str, Any] | None:
        """The OpenAI logprobs object of ``positions`` (None when the chat asked for none)."""
        if not chat.sampling.HasField("logprobs"):
            return None
        decode = self.router.prompts.tokenizer.decode
        return schema.logprobs_json(positions, chat.sampling.logprobs, lambda t: decode([t]))

    async def _stream(
        self, request: web.Request, chat: ChatRequest, include_usage: bool
    ) -> web.StreamResponse:
        pieces = generate_choices(self.router, chat, self.options.request_timeout_s)
        try:
            first = await anext(pieces)
        except StopAsyncIteration:
            first = None
        except Exception as e:  # noqa: BLE001 - before any byte is sent: a plain error response
            return _error(e)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Request-Id": chat.request_id,
            }
        )
        await response.prepare(request)
        ident, model = chat.request_id, chat.model
        for index in range(max(chat.sampling.n, 1)):
            role = {"role": "assistant", "content": ""}
            await _send(response, schema.chunk(ident, model, role, None, index=index))
        usages: dict[int, generation_pb2.Usage] = {}
        try:
            choice = first
            while choice is not None:
                piece = choice.chunk
                await _send(
                    response,
                    schema.chunk(
                        ident,
                        model,
                        {"content": piece.text},
                        piece.finish_reason or None,
                        logprobs=self._logprobs(chat, piece.logprobs),
                        index=choice.index,
                    ),
                )
                if piece.usage is not None:
                    usages[choice.index] = piece.usage
                choice = await anext(pieces, None)
            if include_usage:
                usage = schema.total_usage(list(usages.values()))
                await _send(response, schema.chunk(ident, model, {}, None, usage))
        except Exception as e:  # noqa: BLE001 - mid-stream: an error event, then the end
            await _send(response, schema.error_body(e)[1])
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())


def _error(err: Exception) -> web.Response:
    if not isinstance(err, EpdError):
        logger.error("unexpected error in HTTP handler", exc_info=err)
    status, body = schema.error_body(err)
    return web.json_response(body, status=status)
