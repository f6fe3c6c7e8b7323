"""``epd up``'s public entry flags: where the route listens, its token and its certificate
(``client/public_entry.py`` says what the other services get)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from epd.common.advertise import is_local_address
from epd.launch.public_entry import LOOPBACK, PublicEntry


def add_entry_arguments(parser: argparse.ArgumentParser) -> None:
    """The route's host, token and TLS flags of ``epd up``, with their EPD_* fallbacks."""
    env = os.environ.get
    group = parser.add_argument_group(
        "public entry",
        "the route (gRPC and OpenAI HTTP) is the deployment's entry for other machines; the "
        "scheduler, encoders and engine workers stay on 127.0.0.1 without token or TLS, whatever "
        "these variables or a --config file say",
    )
    group.add_argument(
        "--host",
        default=env("EPD_HOST", LOOPBACK),
        help="address the route listens on (its metrics port too): an address of this host, or "
        "0.0.0.0 or :: for every interface, then printed as this host's primary address "
        f"(env EPD_HOST; default {LOOPBACK})",
    )
    group.add_argument(
        "--auth-token",
        default=env("EPD_AUTH_TOKEN"),
        help="the route requires 'authorization: Bearer TOKEN' on gRPC and HTTP (health checks "
        "excepted); printable ASCII without spaces; the demo request sends it (env "
        "EPD_AUTH_TOKEN)",
    )
    group.add_argument(
        "--tls-cert",
        default=env("EPD_TLS_CERT"),
        help="PEM certificate chain: the route serves gRPC and HTTPS with it (env EPD_TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        default=env("EPD_TLS_KEY"),
        help="PEM private key of --tls-cert (env EPD_TLS_KEY)",
    )
    group.add_argument(
        "--tls-ca-file",
        default=env("EPD_TLS_CA"),
        help="PEM CA the launcher checks the route's certificate with, reaching it at --host "
        "(at localhost when --host is a wildcard: the certificate must name it) (env EPD_TLS_CA; "
        "default --tls-cert, right for a self-signed certificate)",
    )


def public_entry(args: argparse.Namespace) -> PublicEntry:
    """The entry the flags describe; ValueError when a file is missing or --host is not an
    address of this host."""
    host = args.host.strip()
    if not is_local_address(host):
        raise ValueError(f"--host {host!r}: not an address of this host (nor 0.0.0.0 or ::)")
    for flag in ("tls_cert", "tls_key", "tls_ca_file"):
        path = getattr(args, flag)
        if path and not Path(path).is_file():
            raise ValueError(f"--{flag.replace('_', '-')} {path}: no such file")
    return PublicEntry(
        host,
        args.auth_token or None,
        str(Path(args.tls_cert).resolve()) if args.tls_cert else None,
        str(Path(args.tls_key).resolve()) if args.tls_key else None,
        str(Path(args.tls_ca_file).resolve()) if args.tls_ca_file else None,
    )
