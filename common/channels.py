"""Client channels to epd services: tracing, auth, TLS and message limits configured alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from epd.common.auth import bearer_metadata
from epd.common.errors import Unavailable
from epd.common.telemetry import traces_rpcs

MiB = 1 << 20


class _MetadataAdder:
    """Adds fixed metadata (e.g. the bearer token) to a call's details."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._pairs = tuple(pairs)

    async def _intercept(self, continuation: Any, details: Any, request: Any) -> Any:
        """Continue the call (of any kind) with the pairs added to its metadata."""
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._pairs)
        details = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(details, request)


# NOTE: one class per call kind: grpc.aio files an interceptor under the first kind it is an
# instance of, so a single class implementing all four would only ever see unary-unary calls.
class _UnaryUnaryMetadata(_MetadataAdder, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _MetadataAdder._intercept


class _UnaryStreamMetadata(_MetadataAdder, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _MetadataAdder._intercept


class _StreamUnaryMetadata(_MetadataAdder, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _MetadataAdder._intercept


class _StreamStreamMetadata(_MetadataAdder, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _MetadataAdder._intercept


def metadata_interceptors(pairs: Sequence[tuple[str, str]]) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding ``pairs`` to every call of every kind (unary and streaming)."""
    kinds = (_UnaryUnaryMetadata, _UnaryStreamMetadata, _StreamUnaryMetadata, _StreamStreamMetadata)
    return [kind(pairs) for kind in kinds]


# NOTE: a peer whose host drops off the network sends nothing, not even a reset: without pings a
# call to it waits for its deadline. With them, calls in flight fail UNAVAILABLE within about
# twice ``keepalive_s`` (a ping every that many seconds, answered within as many; servers
# accept pings that often: ``server_ping_options``).
DEFAULT_KEEPALIVE_S = 5.0


def keepalive_options(keepalive_s: float) -> list[tuple[str, int]]:
    """Channel options: a ping every ``keepalive_s``, the connection dropped if unanswered as
    long."""
    keepalive_ms = int(keepalive_s * 1000)
    return [("grpc.keepalive_time_ms", keepalive_ms), ("grpc.keepalive_timeout_ms", keepalive_ms)]


def server_ping_options(keepalive_s: float) -> list[tuple[str, int]]:
    """Server options accepting the pings of channels made with the same ``keepalive_s``."""
    return [
        ("grpc.http2.min_ping_interval_without_data_ms", int(keepalive_s * 1000) // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]


# NOTE: gRPC backs off reconnects to a peer that went away by 1.6x per failed attempt up to
# 120 s, so a worker whose scheduler was down for a minute would register again up to two
# minutes after it came back; capped, within about this (plus 20 % jitter). Each channel has its
# own connection (``grpc.use_local_subchannel_pool``): gRPC otherwise shares one among channels
# alike, and a channel opened to replace one in backoff would inherit the backoff.
MAX_RECONNECT_BACKOFF_MS = 5000


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files a channel's TLS is made of; none given: plaintext. ``ca_file`` verifies the
    server (None: the system's roots); ``cert_file`` + ``key_file``: the client's certificate,
    for mTLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def credentials(self) -> grpc.ChannelCredentials | None:
        """The channel credentials of these files, read now (None: plaintext)."""
        if not (self.ca_file or self.cert_file):
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )


PLAINTEXT = TlsFiles()


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


@dataclass(frozen=True)
class ChannelSpec:
    """What a channel to an epd service is opened with, aio or blocking alike."""

    target: str
    options: tuple[tuple[str, int], ...]
    credentials: grpc.ChannelCredentials | None  # None: plaintext


def channel_spec(
    endpoint: str,
    *,
    tls: TlsFiles = PLAINTEXT,
    max_message_bytes: int = 64 * MiB,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
) -> ChannelSpec:
    """Target, options and credentials (``tls``'s) of a channel to ``endpoint`` (host:port),
    pinging it every ``keepalive_s``. ``create_channel`` and ``create_blocking_channel`` both
    open theirs from this, so the async and the blocking clients cannot differ in either."""
    options = (
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        *keepalive_options(keepalive_s),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ("grpc.use_local_subchannel_pool", 1),
    )
    return ChannelSpec(endpoint, options, tls.credentials())


def create_channel(
    endpoint: str,
    *,
    tls: TlsFiles = PLAINTEXT,
    auth_token: str | None = None,
    max_message_bytes: int = 64 * MiB,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
) -> grpc.aio.Channel:
    """Open an aio channel to ``endpoint`` (host:port) as ``channel_spec`` says.

    Every call carries the current trace context (W3C, via the OpenTelemetry interceptors) when
    the process traces (``telemetry.traces_rpcs``) and,
    with ``auth_token``, ``authorization: Bearer``.
    """
    spec = channel_spec(
        endpoint, tls=tls, max_message_bytes=max_message_bytes, keepalive_s=keepalive_s
    )
    interceptors: list[Any] = list(aio_client_interceptors()) if traces_rpcs() else []
    if auth_token:
        interceptors.extend(metadata_interceptors([bearer_metadata(auth_token)]))
    if spec.credentials is None:
        return grpc.aio.insecure_channel(
            spec.target, options=spec.options, interceptors=interceptors
        )
    return grpc.aio.secure_channel(
        spec.target, spec.credentials, options=spec.options, interceptors=interceptors
    )


def create_blocking_channel(
    endpoint: str,
    *,
    tls: TlsFiles = PLAINTEXT,
    max_message_bytes: int = 64 * MiB,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
) -> grpc.Channel:
    """Open a blocking channel to ``endpoint`` as ``channel_spec`` says (the blocking client's).

    It carries no token: its caller sends ``auth.bearer_metadata`` with each call.
    """
    spec = channel_spec(
        endpoint, tls=tls, max_message_bytes=max_message_bytes, keepalive_s=keepalive_s
    )
    if spec.credentials is None:
        return grpc.insecure_channel(spec.target, options=spec.options)
    return grpc.secure_channel(spec.target, spec.credentials, options=spec.options)


Client = TypeVar("Client")


# How long a replaced channel's calls may still run before it is closed under them.
RETIRE_GRACE_S = 60.0


class ChannelPool:
    """Channels to peers, opened on first use (one per endpoint, same token and keepalive) and
    closed together, and the clients made over them (one per endpoint and kind).

    A channel whose peer went away waits out gRPC's reconnect backoff (up to
    ``MAX_RECONNECT_BACKOFF_MS``) and fails every call at once meanwhile, even after the peer is
    back on the same address (a restarted worker); so a channel found in TRANSIENT_FAILURE is
    replaced by a new one, which connects on its first call, and the old one closed."""

    def __init__(
        self, auth_token: str | None = None, *, keepalive_s: float = DEFAULT_KEEPALIVE_S
    ) -> None:
        self._auth_token = auth_token
        self._keepalive_s = keepalive_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._clients: dict[tuple[str, type], tuple[grpc.aio.Channel, object]] = {}
        self._closing: dict[asyncio.Task[None], grpc.aio.Channel] = {}

    def client(self, endpoint: str, kind: Callable[[grpc.aio.Channel, str], Client]) -> Client:
        """The ``kind`` client of ``endpoint``, made as ``kind(channel, endpoint)`` over its
        current channel."""
        key = (endpoint, cast(type, kind))
        channel = self.get(endpoint)
        made = self._clients.get(key)
        if made is None or made[0] is not channel:
            made = self._clients[key] = (channel, kind(channel, endpoint))
        return cast(Client, made[1])

    def get(self, endpoint: str) -> grpc.aio.Channel:
        """The channel to ``endpoint``, opened now if it is the first call or the last one is in
        TRANSIENT_FAILURE."""
        channel = self._channels.get(endpoint)
        if channel is not None:
            if channel.get_state() is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                return channel
            self._retire(channel)
        channel = self._channels[endpoint] = create_channel(
            endpoint, auth_token=self._auth_token, keepalive_s=self._keepalive_s
        )
        return channel

    def _retire(self, channel: grpc.aio.Channel) -> None:
        # NOTE: with a grace: closing a channel cancels its calls, and a cancelled call raises
        # CancelledError in its caller, which no error handler expects (it ended HTTP streams).
        task = asyncio.get_running_loop().create_task(channel.close(RETIRE_GRACE_S))
        self._closing[task] = channel
        task.add_done_callback(self._closing.pop)

    async def close(self) -> None:
        """Close every channel opened so far, those being replaced too (calls still on them end
        CANCELLED)."""
        self._clients.clear()
        for channel in [*self._channels.values(), *self._closing.values()]:
            await channel.close()
        self._channels.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def wait_for_health(
    endpoint: str,
    *,
    service: str = "",
    timeout_s: float = 60.0,
    interval_s: float = 0.1,
    channel: grpc.aio.Channel | None = None,
    tls: TlsFiles = PLAINTEXT,
) -> None:
    """Poll grpc.health.v1 at ``endpoint`` until ``service`` ("" = the whole server) is SERVING.

    Uses ``channel`` when given (left open), else its own channel (over ``tls``; health needs no
    token). Raises Unavailable (reason NOT_HEALTHY, metadata ``endpoint``) with the last status
    seen when ``timeout_s`` passes.
    """
    own_channel = channel is None
    channel = channel or create_channel(endpoint, tls=tls)
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    try:
        while True:
            try:
                request = health_pb2.HealthCheckRequest(service=service)
                remaining = max(deadline - time.monotonic(), 0.05)
                reply = await stub.Check(request, timeout=min(2.0, remaining))
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.aio.AioRpcError as e:
                last = f"{e.code().name}: {e.details()}"
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"{endpoint} not healthy after {timeout_s:g}s (last: {last})",
                    reason="NOT_HEALTHY",
                    metadata={"endpoint": endpoint},
                )
            await asyncio.sleep(interval_s)
    finally:
        if own_channel:
            await channel.close()
