"""Server flags shared by every service's command line, and the ``ServerOptions`` they give."""

from __future__ import annotations

import argparse
import os

from epd.common.cpus import check_available, parse_cpu_list, pin_threads
from epd.common.env import float_env
from epd.common.server import MiB, ServerOptions


def add_server_arguments(parser: argparse.ArgumentParser, default_port: int = 0) -> None:
    """Add the server flags to ``parser``; each falls back to an EPD_* environment variable.
    ValueError naming the variable when $EPD_GRPC_KEEPALIVE_S is malformed. ``ServerOptions``
    owns the defaults (``default_port`` aside: each service has its own)."""
    env = os.environ.get
    defaults = ServerOptions()
    group = parser.add_argument_group("server")
    group.add_argument(
        "--host",
        default=env("EPD_HOST", defaults.host),
        help=f"address to listen on (env EPD_HOST; default {defaults.host}; "
        "0.0.0.0 or :: for all interfaces)",
    )
    group.add_argument(
        "--port",
        type=int,
        default=int(env("EPD_PORT", default_port)),
        help=f"port to listen on, 0 picks a free one (env EPD_PORT; default {default_port})",
    )
    group.add_argument(
        "--max-message-mb",
        type=float,
        default=float(env("EPD_MAX_MESSAGE_MB", defaults.max_message_bytes / MiB)),
        help="largest gRPC message sent or received, in MiB (env EPD_MAX_MESSAGE_MB; default "
        f"{defaults.max_message_bytes / MiB:g})",
    )
    group.add_argument(
        "--tls-cert",
        default=env("EPD_TLS_CERT"),
        help="PEM certificate chain; serves TLS when set (env EPD_TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        default=env("EPD_TLS_KEY"),
        help="PEM private key for --tls-cert (env EPD_TLS_KEY)",
    )
    group.add_argument(
        "--tls-client-ca",
        default=env("EPD_TLS_CLIENT_CA"),
        help="PEM CA bundle; requires and verifies client certificates "
        "(mTLS) when set (env EPD_TLS_CLIENT_CA)",
    )
    group.add_argument(
        "--auth-token",
        default=env("EPD_AUTH_TOKEN"),
        help="require 'authorization: Bearer TOKEN' on every RPC except "
        "health checks (env EPD_AUTH_TOKEN)",
    )
    group.add_argument(
        "--advertise-host",
        default=env("EPD_ADVERTISE_HOST"),
        help="address workers register for peers to reach them at (env EPD_ADVERTISE_HOST; "
        "default: --host, or when --host is a wildcard such as 0.0.0.0 the source address of "
        "this host's route towards --scheduler, else this host's primary address)",
    )
    group.add_argument(
        "--drain-grace-s",
        type=float,
        default=float(env("EPD_DRAIN_GRACE_S", defaults.drain_grace_s)),
        help="on SIGTERM, seconds in-flight RPCs get to finish (env EPD_DRAIN_GRACE_S; default "
        f"{defaults.drain_grace_s:g})",
    )
    group.add_argument(
        "--grpc-keepalive-s",
        type=float,
        default=float_env("EPD_GRPC_KEEPALIVE_S", defaults.keepalive_s),
        help="seconds between pings on this process's channels, and as long for an answer: a "
        "peer that went silent fails calls within about twice this; servers accept pings that "
        f"often (env EPD_GRPC_KEEPALIVE_S; default {defaults.keepalive_s:g})",
    )
    group.add_argument(
        "--cpus",
        default=env("EPD_CPUS"),
        help="CPUs this service and its engine's processes run on, as a list like 0-3,8 (env "
        "EPD_CPUS; default: every CPU it may use; a CPU engine's --cpu-threads and an "
        "encoder's --threads default to their count)",
    )
    metrics_port = env("EPD_METRICS_PORT")
    group.add_argument(
        "--metrics-port",
        type=int,
        default=int(metrics_port) if metrics_port else None,
        help="serve Prometheus metrics (text format, any path, e.g. /metrics) on this port "
        "of --host, 0 = a free one (env EPD_METRICS_PORT; default: off)",
    )


def server_options(args: argparse.Namespace) -> ServerOptions:
    """Options from flags added by ``add_server_arguments``; ValueError when inconsistent."""
    return ServerOptions(
        host=args.host,
        port=args.port,
        max_message_bytes=int(args.max_message_mb * MiB),
        tls_cert_file=args.tls_cert or None,
        tls_key_file=args.tls_key or None,
        tls_client_ca_file=args.tls_client_ca or None,
        auth_token=args.auth_token or None,
        drain_grace_s=args.drain_grace_s,
        advertise_host=args.advertise_host or None,
        metrics_port=args.metrics_port,
        keepalive_s=args.grpc_keepalive_s,
    )


def pin_to_cpus(args: argparse.Namespace) -> list[int] | None:
    """Pin this process (every thread it has, and so every thread and child it starts later)
    to ``--cpus``; returns them, or None when the flag is unset. ValueError when the list is
    malformed or names a CPU this process may not use."""
    if not args.cpus:
        return None
    cpus = parse_cpu_list(args.cpus)
    check_available(cpus)
    pin_threads(os.getpid(), cpus)
    return cpus
