"""Bearer-token authentication for servers (an aio interceptor) and channels (metadata)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from epd.common.errors import Unauthenticated
from epd.common.status import to_rpc_status

# Probes (load balancers, orchestrators) check health without credentials.
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
AUTHORIZATION_KEY = "authorization"


def token_identity(token: str) -> str:
    """A caller's stable identity from its bearer ``token``: a digest (32 hex digits) that
    names the tenant in cache keys without revealing the token; "" for no token."""
    if not token:
        return ""
    return hashlib.blake2b(token.encode(), digest_size=16, person=b"epd-token-id").hexdigest()


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization`` value (``Bearer TOKEN``), "" for any other value."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def bearer_metadata(token: str) -> tuple[str, str]:
    """The metadata pair a client sends to authenticate with ``token``."""
    return (AUTHORIZATION_KEY, f"Bearer {token}")


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Reject every call (health checks excepted) without ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must not be empty")
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if (
            handler is None
            or method.startswith(EXEMPT_PREFIXES)
            or self._is_authorized(handler_call_details)
        ):
            return handler
        return _rejecting_handler(handler)

    def _is_authorized(self, details: grpc.HandlerCallDetails) -> bool:
        for key, value in details.invocation_metadata or ():
            if key == AUTHORIZATION_KEY:
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False


def _rejecting_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    status = to_rpc_status(Unauthenticated("missing or invalid bearer token"))

    async def reject(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort_with_status(status)

    kwargs = dict(
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(reject, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(reject, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(reject, **kwargs)
    return grpc.stream_stream_rpc_method_handler(reject, **kwargs)
