"""The OpenAI HTTP port's defences below the handlers: connection cap, header and idle timeouts,
TLS, bearer-token auth, and a bounded JSON body.

aiohttp closes a connection that sits without a request for its keep-alive timeout (our idle
timeout) but has no header-read timeout and no connection cap: ``GuardedRequestHandler`` adds
both, and ``GuardedSite`` listens with it. A connection over the cap is answered 503 and closed
before anything is read; a request whose headers are not complete ``header_timeout_s`` after its
first byte is answered 408 and closed (a slow-header client cannot hold a connection longer).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from epd.common.auth import token_identity
from epd.common.flags import flag
from epd.common.server_tls import ServerTls

MiB = 1 << 20
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

# Where an authenticated request keeps its caller's identity (``ChatRequest.tenant``).
TENANT_KEY = web.RequestKey("epd_tenant", str)
# Paths open without a token, as gRPC health is (probes carry no credentials).
OPEN_PATHS = frozenset({"/health", "/version"})
# Bodies up to this size are parsed on the event loop (well under a millisecond).
INLINE_PARSE_BYTES = 256 << 10
# Seconds an answered connection keeps reading a body nobody will parse.
LINGERING_S = 1.0
# Every byte but the separators and container openings (deleted in one pass over a body).
_NOT_SEPARATORS = bytes(sorted(set(range(256)) - set(b",[{")))
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """Limits, timeouts and security of the OpenAI HTTP port (flags in ``epd route --help``)."""

    max_body_bytes: int = field(
        default=48 * MiB,
        metadata=flag(
            "largest request body, in MiB; larger ones get 413",
            env="EPD_HTTP_MAX_BODY_MB",
            name="http-max-body-mb",
            unit=MiB,
        ),
    )
    max_json_values: int = field(
        default=100_000,
        metadata=flag(
            "most JSON values (numbers, strings, arrays, objects) in one body, counted before "
            "parsing",
            env="EPD_HTTP_MAX_JSON_VALUES",
            name="http-max-json-values",
        ),
    )
    header_timeout_s: float = field(
        default=10.0,
        metadata=flag(
            "seconds from a request's first byte to the end of its headers; slower clients get "
            "408 and are closed",
            env="EPD_HTTP_HEADER_TIMEOUT_S",
            name="http-header-timeout-s",
        ),
    )
    body_timeout_s: float = field(
        default=60.0,
        metadata=flag(
            "seconds a request's body may take to arrive",
            env="EPD_HTTP_BODY_TIMEOUT_S",
            name="http-body-timeout-s",
        ),
    )
    idle_timeout_s: float = field(
        default=75.0,
        metadata=flag(
            "seconds a connection may sit without a request before it is closed",
            env="EPD_HTTP_IDLE_TIMEOUT_S",
            name="http-idle-timeout-s",
        ),
    )
    max_connections: int = field(
        default=512,
        metadata=flag(
            "open connections the HTTP port holds; more are answered 503 and closed",
            env="EPD_HTTP_MAX_CONNECTIONS",
            name="http-max-connections",
        ),
    )
    request_timeout_s: float = field(
        default=600.0,
        metadata=flag(
            "time limit of one chat completion, streaming included",
            env="EPD_HTTP_REQUEST_TIMEOUT_S",
            name="http-request-timeout-s",
        ),
    )
    tenant_tokens_file: str | None = field(
        default=None,
        metadata=flag(
            "a file of further bearer tokens this port accepts beside --auth-token, one per "
            "line; each token is a tenant whose cache keys (embeddings, prefix blocks) are its "
            "own, so no tenant's request hits another's cached entries",
            env="EPD_TENANT_TOKENS_FILE",
            default_help="default: --auth-token's alone",
        ),
    )
    auth_token: str | None = None
    tls: ServerTls = field(default_factory=ServerTls)

    def __post_init__(self) -> None:
        positive = {
            "max body size": self.max_body_bytes,
            "max JSON values": self.max_json_values,
            "header timeout": self.header_timeout_s,
            "body timeout": self.body_timeout_s,
            "idle timeout": self.idle_timeout_s,
            "max connections": self.max_connections,
            "request timeout": self.request_timeout_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"HTTP {name} must be positive, got {value}")

    def tokens(self) -> list[str]:
        """The bearer tokens the port accepts: --auth-token's, then the tenant tokens file's
        (blank lines and ``#`` comments skipped); empty without auth. OSError for a file that
        cannot be read."""
        if not self.auth_token:
            return []
        tokens = [self.auth_token]
        if self.tenant_tokens_file:
            lines = Path(self.tenant_tokens_file).read_text().splitlines()
            tokens += [line.strip() for line in lines if line.strip()[:1] not in ("", "#")]
        return tokens


class HttpError(Exception):
    """A request refused before it reached a handler's logic: status, OpenAI error fields."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def response(self) -> web.Response:
        """The OpenAI-style error response."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return web.json_response({"error": body}, status=self.status, headers=headers)


def auth_middleware(tokens: list[str]) -> Any:
    """A middleware refusing every path but ``OPEN_PATHS`` without ``Bearer <token>`` for one
    of ``tokens``; tokens are compared in constant time and never logged. An accepted request
    carries its token's identity (``common.auth.token_identity``) under ``TENANT_KEY``."""
    if not tokens or not all(tokens):
        raise ValueError("auth tokens must not be empty")
    accepted = [(f"Bearer {token}".encode(), token_identity(token)) for token in tokens]

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        # NOTE: every token compared, so the time taken says nothing of which one matched.
        tenants = [tenant for value, tenant in accepted if hmac.compare_digest(given, value)]
        if not tenants:
            return HttpError(
                401,
                "missing or invalid bearer token (Authorization: Bearer ...)",
                "invalid_api_key",
            ).response()
        request[TENANT_KEY] = tenants[0]
        return await handler(request)

    return check_token


async def read_json(request: web.Request, options: HttpOptions, then: Callable[[Any], T]) -> T:
    """``then`` of the request's JSON body, read within the body timeout and size limit,
    refused before parsing if it holds more than ``max_json_values`` values, parsed and handed
    to ``then`` off the event loop, in one thread, when large (work that grows with the body).
    Raises HttpError (413, 408 or 400), and what ``then`` raises."""
    length = request.content_length
    if length is not None and length > options.max_body_bytes:
        raise _too_large(options)
    try:
        body = await asyncio.wait_for(request.read(), options.body_timeout_s)
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(options) from None
    except TimeoutError:
        raise HttpError(
            408, f"the body did not arrive within {options.body_timeout_s:g}s", "request_timeout"
        ) from None
    if len(body) <= INLINE_PARSE_BYTES:
        return then(parse_json(body, options.max_json_values))
    return await asyncio.to_thread(lambda: then(parse_json(body, options.max_json_values)))


def parse_json(body: bytes, max_values: int) -> Any:
    """``body`` parsed, if it holds at most ``max_values`` values; else HttpError 400."""
    if count_json_values(body, max_values) > max_values:
        raise HttpError(
            400, f"the body holds more than {max_values} JSON values", "body_too_complex", "body"
        )
    try:
        return json.loads(body)
    except RecursionError:
        raise HttpError(400, "the body's JSON is nested too deeply", "bad_json", "body") from None
    except ValueError:
        raise HttpError(400, "the body is not valid JSON (UTF-8)", "bad_json", "body") from None


def count_json_values(body: bytes, limit: int) -> int:
    """The number of values in the JSON text ``body`` (separators and container openings outside
    strings, plus one; more for invalid JSON), exact enough to compare with ``limit``: counted
    at C speed over the raw bytes first, and over the bytes without strings only when the raw
    count is over ``limit`` and the strings alone (each a value) are not."""
    raw = _separators(body)
    if raw <= limit:
        return raw
    num_strings = (body.count(b'"') - body.count(b'\\"')) // 2
    if num_strings > limit:
        return num_strings
    return _separators(_JSON_STRING.sub(b"", body))


def _separators(text: bytes) -> int:
    return len(text.translate(None, _NOT_SEPARATORS)) + 1


def _too_large(options: HttpOptions) -> HttpError:
    limit = options.max_body_bytes / MiB
    return HttpError(413, f"the body is larger than {limit:g} MiB", "body_too_large", "body")


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with a connection cap and a header-read timeout."""

    def __init__(self, manager: web.Server, *, options: HttpOptions, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._options = options
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(self._manager.connections) > self._options.max_connections:  # type: ignore[union-attr]
            self._answer_and_close(503, "too many connections; retry later")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._has_request():
            self._cancel_header_timer()
        elif data and self._header_timer is None:
            self._header_timer = self._loop.call_later(
                self._options.header_timeout_s, self._on_header_timeout
            )

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _has_request(self) -> bool:
        return bool(self._messages) or self._request_in_progress

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if not self._has_request():
            self._answer_and_close(408, "request headers took too long")

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _answer_and_close(self, status: int, message: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            body = json.dumps(
                {
                    "error": {
                        "message": message,
                        "type": "server_error",
                        "param": None,
                        "code": str(status),
                    }
                }
            ).encode()
            reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
            head = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        self.force_close()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections are ``GuardedRequestHandler``s."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, options: HttpOptions) -> None:
        super().__init__(runner, host, port, ssl_context=options.tls.ssl_context())
        self._options = options

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        manager = self._runner.server
        assert manager is not None
        options = self._options

        def protocol() -> GuardedRequestHandler:
            # NOTE: after answering a body it did not read (413, 401), aiohttp reads and drops
            # the rest for lingering_time so the client sees the answer; its 10 s default held
            # every refused upload's connection that long.
            return GuardedRequestHandler(
                manager,
                options=options,
                loop=loop,
                keepalive_timeout=options.idle_timeout_s,
                lingering_time=LINGERING_S,
                access_log=None,
            )

        self._server = await loop.create_server(
            protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
