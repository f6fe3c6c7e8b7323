"""``epd up``'s public entry flags: where the route listens, its token and its certificate
(``client/public_entry.py`` says what the other services get)."""

from __future__ import annotations

import argparse
from pathlib import Path

from epd.common.advertise import is_local_address
from epd.common.flags import add_dataclass_arguments, from_arguments
from epd.launch.public_entry import PublicEntry


def add_entry_arguments(parser: argparse.ArgumentParser) -> None:
    """The route's host, token and TLS flags of ``epd up`` (``PublicEntry``'s fields declare
    them), with their EPD_* fallbacks."""
    group = parser.add_argument_group(
        "public entry",
        "the route (gRPC and OpenAI HTTP) is the deployment's entry for other machines; the "
        "scheduler, encoders and engine workers stay on 127.0.0.1 without token or TLS, whatever "
        "these variables or a --config file say",
    )
    add_dataclass_arguments(group, PublicEntry)


def public_entry(args: argparse.Namespace) -> PublicEntry:
    """The entry the flags describe; ValueError when a file is missing or --host is not an
    address of this host."""
    host = args.host.strip()
    if not is_local_address(host):
        raise ValueError(f"--host {host!r}: not an address of this host (nor 0.0.0.0 or ::)")
    return from_arguments(
        PublicEntry,
        args,
        host=host,
        tls_cert_file=existing_file("--tls-cert", args.tls_cert),
        tls_key_file=existing_file("--tls-key", args.tls_key),
        tls_ca_file=existing_file("--tls-ca-file", args.tls_ca_file),
    )


def existing_file(flag: str, path: str | None) -> str | None:
    """``path`` resolved (None for none); ValueError naming ``flag`` when it is no file."""
    if not path:
        return None
    if not Path(path).is_file():
        raise ValueError(f"{flag} {path}: no such file")
    return str(Path(path).resolve())
