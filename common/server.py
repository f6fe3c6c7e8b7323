"""One way to build and run an epd gRPC server.

``build_server`` gives every service the same behaviour: standard health (NOT_SERVING until the
service calls ``mark_serving``, NOT_SERVING again once draining), server reflection (so
``grpcurl -plaintext HOST:PORT list`` works without .proto files), OpenTelemetry spans for every
RPC but health and reflection, with the caller's trace context, when the process traces
(``telemetry.traces_rpcs``), optional bearer-token auth and TLS / mTLS, message-size limits,
INVALID_ARGUMENT (reason BAD_MESSAGE) for requests that do not parse (``bad_messages``), and
Prometheus metrics of the service's registry on ``--metrics-port`` (``metrics``).
``EpdServer.drain_and_stop`` drains it; ``serving.serve`` runs it until a stop signal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters
from prometheus_client import CollectorRegistry

from epd.common.advertise import advertised_host, endpoint, is_wildcard
from epd.common.auth import BearerTokenInterceptor
from epd.common.bad_messages import BadMessageInterceptor
from epd.common.channels import DEFAULT_KEEPALIVE_S, server_ping_options
from epd.common.flags import flag, flag_group
from epd.common.metrics import MetricsServer, start_metrics_server
from epd.common.server_tls import ServerTls
from epd.common.telemetry import traces_rpcs

logger = logging.getLogger(__name__)

MiB = 1 << 20
DrainCallback = Callable[[], Awaitable[None]]
DrainHold = Callable[[], bool]
# How often a drain asks its holds whether what they keep has been taken.
HOLD_POLL_S = 0.05


# NOTE: health and reflection are not traced: probes would flood traces, and the
# instrumentation cannot serve a stream handler that is a coroutine writing through the context
# (health's Watch).
_TRACED = filters.negate(
    filters.any_of(
        filters.service_prefix("grpc.health."),
        filters.service_prefix("grpc.reflection."),
    )
)


@dataclass(slots=True)
class ServerOptions:
    """Network, security and shutdown settings shared by every epd server."""

    host: str = field(
        default="127.0.0.1",
        metadata=flag(
            "address to listen on; 0.0.0.0 or :: for all interfaces",
            env="EPD_HOST",
        ),
    )
    # NOTE: each service's cli gives its own default port.
    port: int = field(
        default=0, metadata=flag("port to listen on, 0 picks a free one", env="EPD_PORT")
    )
    max_message_bytes: int = field(
        default=64 * MiB,
        metadata=flag(
            "largest gRPC message sent or received, in MiB",
            env="EPD_MAX_MESSAGE_MB",
            name="max-message-mb",
            unit=MiB,
        ),
    )
    tls: ServerTls = field(default_factory=ServerTls, metadata=flag_group())
    auth_token: str | None = field(
        default=None,
        metadata=flag(
            "require 'authorization: Bearer TOKEN' on every RPC except health checks",
            env="EPD_AUTH_TOKEN",
            aliases=("api-key",),
            also_env=("VLLM_API_KEY",),
        ),
    )
    drain_grace_s: float = field(
        default=10.0,
        metadata=flag("on SIGTERM, seconds in-flight RPCs get to finish", env="EPD_DRAIN_GRACE_S"),
    )
    advertise_host: str | None = field(
        default=None,
        metadata=flag(
            "address workers register for peers to reach them at",
            env="EPD_ADVERTISE_HOST",
            default_help="default: --host, or when --host is a wildcard such as 0.0.0.0 the "
            "source address of this host's route towards --scheduler, else this host's "
            "primary address",
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=flag(
            "serve Prometheus metrics (text format, any path, e.g. /metrics) on this port of "
            "--host, 0 = a free one",
            env="EPD_METRICS_PORT",
            default_help="default: off",
        ),
    )
    keepalive_s: float = field(
        default=DEFAULT_KEEPALIVE_S,
        metadata=flag(
            "seconds between pings on this process's channels, and as long for an answer: a "
            "peer that went silent fails calls within about twice this; servers accept pings "
            "that often",
            env="EPD_GRPC_KEEPALIVE_S",
            name="grpc-keepalive-s",
        ),
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics port must be in 0..65535, got {self.metrics_port}")
        if self.max_message_bytes <= 0:
            raise ValueError("max message size must be positive")
        if self.drain_grace_s < 0:
            raise ValueError("drain grace must not be negative")
        if self.keepalive_s <= 0:
            raise ValueError(f"gRPC keepalive must be positive, got {self.keepalive_s}")
        if self.advertise_host is not None and is_wildcard(self.advertise_host):
            raise ValueError(
                f"--advertise-host {self.advertise_host!r} is a wildcard; give the address "
                "peers reach this server at"
            )

    def advertised_endpoint(self, port: int, scheduler: str | None) -> str:
        """host:port a worker registering with ``scheduler`` (None: none) registers:
        ``advertise_host``, the bind host if it is one address, else the source address of the
        route towards the scheduler, else this host's primary address (see ``advertise``)."""
        return endpoint(advertised_host(self.host, self.advertise_host, scheduler), port)

    @property
    def exports_metrics(self) -> bool:
        """Whether this server serves Prometheus metrics (``metrics_port`` is set)."""
        return self.metrics_port is not None

    @property
    def address(self) -> str:
        """The address to bind, host:port (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass(slots=True)
class ServiceBinding:
    """One service to serve: its full name, the servicer, and the generated ``add_*`` function."""

    name: str
    servicer: object
    register: Callable[[Any, grpc.aio.Server], None]


@dataclass
class EpdServer:
    """A running server: its port, health state and drain logic."""

    grpc_server: grpc.aio.Server
    port: int
    service_names: list[str]
    health_servicer: health.aio.HealthServicer
    options: ServerOptions
    _drain_callbacks: list[DrainCallback] = field(default_factory=list)
    _drain_holds: list[DrainHold] = field(default_factory=list)
    _is_cut_short: bool = False
    _drain_task: asyncio.Task[None] | None = None
    metrics: MetricsServer | None = None

    async def mark_serving(self) -> None:
        """Report SERVING for every service (call once warm, e.g. after the model loaded)."""
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)

    async def mark_not_serving(self) -> None:
        """Report NOT_SERVING for every service while staying up."""
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)

    def add_drain_callback(self, callback: DrainCallback) -> None:
        """Run ``callback`` when draining starts, before in-flight RPCs finish (e.g. deregister)."""
        self._drain_callbacks.append(callback)

    def add_drain_hold(self, is_settled: DrainHold) -> None:
        """Keep serving after the drain callbacks until ``is_settled()`` is true (e.g. every
        payload this server lent was released by its consumer) or the grace runs out; only then
        are new RPCs refused. The service refuses new work itself meanwhile (a drain callback)."""
        self._drain_holds.append(is_settled)

    async def drain_and_stop(self, grace: float | None = None) -> None:
        """Stop taking work: health NOT_SERVING, drain callbacks, wait for the drain holds,
        then let in-flight RPCs finish while refusing new ones; all within ``grace`` seconds
        (default: options.drain_grace_s). RPCs still running when the grace ends are cancelled:
        their callers see UNAVAILABLE. Idempotent: later calls wait for the first drain."""
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain(grace))
        await asyncio.shield(self._drain_task)

    async def stop_now(self) -> None:
        """Stop at once: a drain under way stops waiting for its holds, running RPCs are
        cancelled."""
        self._is_cut_short = True
        await self.grpc_server.stop(0)

    async def wait_for_termination(self) -> None:
        """Wait until the server has stopped."""
        await self.grpc_server.wait_for_termination()

    async def _drain(self, grace: float | None) -> None:
        deadline = time.monotonic() + (self.options.drain_grace_s if grace is None else grace)
        await self.health_servicer.enter_graceful_shutdown()
        for callback in self._drain_callbacks:
            try:
                await callback()
            except Exception:
                logger.exception("drain callback failed")
        while not all(is_settled() for is_settled in self._drain_holds):
            if self._is_cut_short or time.monotonic() >= deadline:
                logger.warning("drain grace ended with work still held")
                break
            await asyncio.sleep(HOLD_POLL_S)
        await self.grpc_server.stop(max(0.0, deadline - time.monotonic()))
        if self.metrics is not None:
            self.metrics.close()

    async def _set_all(self, status: int) -> None:
        for name in ["", *self.service_names]:
            await self.health_servicer.set(name, status)


async def build_server(
    bindings: Sequence[ServiceBinding],
    options: ServerOptions | None = None,
    registry: CollectorRegistry | None = None,
    *,
    on_bound: Callable[[int], None] | None = None,
) -> tuple[EpdServer, int]:
    """Create, bind and start a server for ``bindings``; returns it and the bound port.
    With ``options.metrics_port`` set, ``registry`` is served there until the server drains.
    ``on_bound`` is called with the bound port before the server takes its first RPC (e.g. to
    name a worker after its port)."""
    options = options or ServerOptions()
    server = grpc.aio.server(
        interceptors=_interceptors(options),
        options=[
            ("grpc.max_send_message_length", options.max_message_bytes),
            ("grpc.max_receive_message_length", options.max_message_bytes),
            *server_ping_options(options.keepalive_s),
            ("grpc.so_reuseport", 0),
        ],
    )
    for binding in bindings:
        binding.register(binding.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [binding.name for binding in bindings]
    reflection.enable_server_reflection(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    port = _bind(server, options)
    if on_bound is not None:
        on_bound(port)
    epd_server = EpdServer(server, port, names, health_servicer, options)
    await epd_server.mark_not_serving()
    await server.start()
    if registry is not None and options.metrics_port is not None:
        try:
            epd_server.metrics = start_metrics_server(
                registry,
                options.host,
                options.metrics_port,
                certfile=options.tls.cert_file,
                keyfile=options.tls.key_file,
            )
        except OSError:
            await server.stop(0)
            raise
    logger.info("serving %s on %s:%d", ", ".join(names), options.host, port)
    return epd_server, port


def _interceptors(options: ServerOptions) -> list[grpc.aio.ServerInterceptor]:
    """Bearer-token check first, then tracing where spans are exported, then the unparseable
    request check (innermost, so it rewraps the handlers as registered, once per method)."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if options.auth_token:
        interceptors.append(BearerTokenInterceptor(options.auth_token))
    if traces_rpcs():
        interceptors.append(aio_server_interceptor(filter_=_TRACED))
    interceptors.append(BadMessageInterceptor())
    return interceptors


def _bind(server: grpc.aio.Server, options: ServerOptions) -> int:
    credentials = options.tls.credentials()
    if credentials is None:
        port = server.add_insecure_port(options.address)
    else:
        port = server.add_secure_port(options.address, credentials)
    if port == 0:
        raise OSError(f"could not bind {options.address}")
    return int(port)
