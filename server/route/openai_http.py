"""OpenAI-compatible HTTP in the route process: /v1/chat/completions and /v1/completions (each
with SSE streaming), /v1/models, /health and /version, served by aiohttp on its own port and
driving the same Router as gRPC, so the official ``openai`` client and OpenAI-speaking
benchmarks work unchanged."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from epd import __version__
from epd.common.errors import EpdError, Unavailable
from epd.common.http_tracing import tracing_middleware
from epd.common.telemetry import traces_rpcs
from epd.server.route import openai_answers, openai_logprobs
from epd.server.route import openai_completions as completions
from epd.server.route import openai_schema as schema
from epd.server.route.choices import Choice, generate_choices
from epd.server.route.http_guard import (
    TENANT_KEY,
    GuardedSite,
    HttpError,
    HttpOptions,
    auth_middleware,
    read_json,
)
from epd.server.route.openai_completions import CompletionWriter
from epd.server.route.reasoning_gate import gate_request
from epd.server.route.request import ChatRequest
from epd.server.route.request_check import RequestLimits
from epd.server.route.router import Router
from epd.server.route.stream_interval import batched
from epd.server.route.tools import ToolCalling
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
        tools: ToolCalling | None = None,
        trust_chat_template: bool = False,
    ) -> None:
        """``options``: the port's limits, timeouts, token and TLS; ``limits``: what one
        chat-completions body may hold; ``sampling_defaults``: the model's default sampling
        values (``sampling.generation_defaults``), under a body's own; ``tools``: the tool and
        reasoning parsers (``tools.ToolOptions``; None: none); ``trust_chat_template``: a body
        may bring its own chat template (``--trust-request-chat-template``)."""
        self.tools = tools
        self.trust_chat_template = trust_chat_template
        self.router = router
        self.options = options or HttpOptions()
        self.limits = limits or RequestLimits()
        self.sampling_defaults = sampling_defaults or {}
        self.is_draining = False
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def scheme(self) -> str:
        """https when the port serves TLS, else http."""
        return "https" if self.options.tls.is_on else "http"

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 picks a free port); returns the port."""
        # NOTE: as the gRPC side: a SERVER span per request only where spans are exported
        middlewares = [tracing_middleware] if traces_rpcs() else []
        if self.options.auth_token:
            middlewares.append(auth_middleware(self.options.tokens()))
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=middlewares)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat_completions),
                web.post("/v1/completions", self.completions),
                web.get("/v1/models", self.models),
                web.get("/health", self.health),
                web.get("/version", self.version),
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
        """200 while the route takes requests, 503 once it drains (a readiness probe takes the
        pod out of its Service; a stream already running goes on)."""
        if self.is_draining:
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ok"})

    async def start_draining(self) -> None:
        """Refuse new requests (503) and report unready; the streams under way go on."""
        self.is_draining = True

    async def version(self, request: web.Request) -> web.Response:
        """epd's version, as ``vllm serve`` answers GET /version with vLLM's."""
        return web.json_response({"version": __version__})

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
        return await self._answer(request, ChatApi(self))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, CompletionApi(self))

    async def _answer(self, request: web.Request, api: Api) -> web.StreamResponse:
        """Read the body, convert it with ``api`` and answer it, whole or streamed."""
        if self.is_draining:
            return _error(Unavailable("the route is draining; retry", reason="DRAINING"))
        request_id = request.headers.get("X-Request-Id")
        try:
            body, chat = await read_json(
                request, self.options, lambda value: (value, api.convert(value, request_id))
            )
        except HttpError as e:
            return e.response()
        except EpdError as e:
            return _error(e)
        chat.tenant = request.get(TENANT_KEY, "")
        num_answers = max(chat.sampling.n, 1) * (1 + len(chat.more_prompts))
        answers = [openai_answers.Answer() for _ in range(num_answers)]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, chat, api, answers, include_usage)
        try:
            choices = generate_choices(self.router, chat, self.options.request_timeout_s)
            async for choice in choices:
                answers[choice.index].add(choice.chunk)
        except Exception as e:  # noqa: BLE001 - reported as an OpenAI error body
            return _error(e)
        return web.json_response(
            api.whole(chat, answers), headers={"X-Request-Id": chat.request_id}
        )

    def decode(self, token_id: int) -> str:
        """The text of one token, for logprobs an engine sent without it."""
        return str(self.router.prompts.tokenizer.decode([token_id]))

    async def _stream(
        self,
        request: web.Request,
        chat: ChatRequest,
        api: Api,
        answers: list[openai_answers.Answer],
        include_usage: bool,
    ) -> web.StreamResponse:
        """Stream ``chat``'s answers as server-sent events, each choice's chunks added to its
        ``answers`` entry (what it has said so far)."""
        pieces = generate_choices(self.router, chat, self.options.request_timeout_s)
        if chat.stream_interval > 1:
            pieces = batched(pieces, chat.stream_interval)
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
        prompt_ids = first.chunk.prompt_token_ids if first is not None else None
        prompt_text = first.chunk.prompt_text if first is not None else None
        for payload in api.opening(chat, prompt_ids, prompt_text):
            await _send(response, payload)
        try:
            choice = first
            while choice is not None:
                delta = api.delta(chat, choice, answers[choice.index])
                if delta is not None:
                    await _send(response, delta)
                answers[choice.index].add(choice.chunk)
                choice = await anext(pieces, None)
            if include_usage:
                await _send(response, api.usage(chat, openai_answers.total_usage(answers)))
        except Exception as e:  # noqa: BLE001 - mid-stream: an error event, then the end
            await _send(response, openai_answers.error_body(e)[1])
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class Api(Protocol):
    """One OpenAI API of the port: its body, whole answer and stream's payloads."""

    def convert(self, body: Any, request_id: str | None) -> ChatRequest:
        """The request of ``body`` (``request_id``: the X-Request-Id header)."""

    def whole(self, chat: ChatRequest, answers: list[openai_answers.Answer]) -> dict[str, Any]:
        """The non-streamed answer, one choice per answer."""

    def opening(
        self, chat: ChatRequest, prompt_ids: list[int] | None, prompt_text: str | None
    ) -> list[dict[str, Any]]:
        """What a stream sends before its first token (``prompt_ids``: the prompt's token ids
        as the engine holds them, when the request asked for them or its reasoning parser reads
        them; ``prompt_text``: the chat template's text, when the request asked for it)."""

    def delta(
        self, chat: ChatRequest, choice: Choice, so_far: openai_answers.Answer
    ) -> dict[str, Any] | None:
        """The payload of ``choice``'s chunk, ``so_far`` its completion before it (None: nothing
        to send for it)."""

    def usage(self, chat: ChatRequest, usage: generation_pb2.Usage | None) -> dict[str, Any]:
        """The stream's usage payload."""


@dataclass
class ChatApi:
    """``/v1/chat/completions``."""

    http: OpenAiHttp

    def convert(self, body: Any, request_id: str | None) -> ChatRequest:
        http = self.http
        chat = schema.to_chat_request(
            body,
            http.router.model_id,
            request_id,
            http.limits,
            http.sampling_defaults,
            http.tools,
            http.trust_chat_template,
        )
        if chat.sampling.HasField("structured_output"):
            gate_request(chat, http.router.prompts)
        return chat

    def whole(self, chat: ChatRequest, answers: list[openai_answers.Answer]) -> dict[str, Any]:
        logprobs = [self._logprobs(chat, answer.positions, answer.token_ids) for answer in answers]
        body = openai_answers.completion(chat.request_id, chat.model, answers, logprobs)
        body["prompt_text"] = answers[0].prompt_text if answers else None
        if chat.return_token_ids:
            openai_answers.add_token_ids(body, answers, chat.answer_parsing)
        if chat.answer_parsing is not None:
            if answers and answers[0].prompt_token_ids is not None:
                chat.answer_parsing.prompt_token_ids = answers[0].prompt_token_ids
            chat.answer_parsing.parse_choices(body["choices"], answers, chat.echo)
        elif chat.echo:
            for choice in body["choices"]:
                choice["message"]["content"] = chat.echo + choice["message"]["content"]
        return body

    def opening(
        self, chat: ChatRequest, prompt_ids: list[int] | None, prompt_text: str | None
    ) -> list[dict[str, Any]]:
        role = {"role": "assistant", "content": ""}
        num_choices = max(chat.sampling.n, 1)
        chunks = [
            openai_answers.chunk(chat.request_id, chat.model, role, None, index=i)
            for i in range(num_choices)
        ]
        if chat.answer_parsing is not None and prompt_ids is not None:
            chat.answer_parsing.prompt_token_ids = prompt_ids
        if chat.return_token_ids and prompt_ids is not None:  # NOTE: as vLLM: each first chunk
            for payload in chunks:
                payload["prompt_token_ids"] = prompt_ids
        if chat.return_prompt_text:  # NOTE: likewise
            for payload in chunks:
                payload["prompt_text"] = prompt_text
        if chat.echo:  # NOTE: as vLLM: every choice's role, then every choice's echo
            echo = {"content": chat.echo}
            chunks += [
                openai_answers.chunk(chat.request_id, chat.model, echo, None, index=i)
                for i in range(num_choices)
            ]
        return chunks

    def delta(
        self, chat: ChatRequest, choice: Choice, so_far: openai_answers.Answer
    ) -> dict[str, Any] | None:
        piece = choice.chunk
        payload = openai_answers.chunk(
            chat.request_id,
            chat.model,
            {"content": piece.text},
            piece.finish_reason or None,
            logprobs=self._logprobs(chat, piece.logprobs, piece.token_ids),
            index=choice.index,
        )
        if chat.return_token_ids:
            payload["choices"][0]["token_ids"] = list(piece.token_ids)
        if chat.answer_parsing is not None:
            return chat.answer_parsing.parsed_chunk(
                payload, choice.index, piece.text, list(piece.token_ids)
            )
        return payload

    def usage(self, chat: ChatRequest, usage: generation_pb2.Usage | None) -> dict[str, Any]:
        return openai_answers.chunk(chat.request_id, chat.model, {}, None, usage)

    def _logprobs(
        self,
        chat: ChatRequest,
        positions: list[generation_pb2.TokenLogprobs],
        token_ids: list[int],
    ) -> dict[str, Any] | None:
        sampling = chat.sampling
        if not sampling.HasField("logprobs") and not sampling.logprob_token_ids:
            return None  # NOTE: an ordinary request's chunks make no call
        num_top = openai_logprobs.num_top_logprobs(sampling)
        assert num_top is not None
        decode = self.http.decode
        as_ids = chat.tokens_as_ids
        return openai_logprobs.logprobs_json(positions, num_top, decode, as_ids, token_ids)


@dataclass
class CompletionApi:
    """``/v1/completions``: its prompts' answers, as ``completions.CompletionWriter`` writes
    them."""

    http: OpenAiHttp
    writer: CompletionWriter | None = None

    def convert(self, body: Any, request_id: str | None) -> ChatRequest:
        http = self.http
        chat, prompt = completions.to_completion_request(
            body,
            http.router.model_id,
            http.router.prompts.tokenizer,
            request_id,
            http.limits,
            http.sampling_defaults,
        )
        self.writer = CompletionWriter(chat, prompt, http.decode)
        return chat

    def whole(self, chat: ChatRequest, answers: list[openai_answers.Answer]) -> dict[str, Any]:
        assert self.writer is not None
        return self.writer.whole(answers)

    def opening(
        self, chat: ChatRequest, prompt_ids: list[int] | None, prompt_text: str | None
    ) -> list[dict[str, Any]]:
        return []

    def delta(
        self, chat: ChatRequest, choice: Choice, so_far: openai_answers.Answer
    ) -> dict[str, Any]:
        assert self.writer is not None
        return self.writer.delta(choice.index, choice.chunk, so_far)

    def usage(self, chat: ChatRequest, usage: generation_pb2.Usage | None) -> dict[str, Any]:
        assert self.writer is not None
        return self.writer.usage(usage)


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())


def _error(err: Exception) -> web.Response:
    if not isinstance(err, EpdError):
        logger.error("unexpected error in HTTP handler", exc_info=err)
    status, body = openai_answers.error_body(err)
    return web.json_response(body, status=status)
