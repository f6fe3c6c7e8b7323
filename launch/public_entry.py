"""The route is the public entry of an ``epd up`` deployment: its gRPC port and its OpenAI HTTP
port are what other machines reach. ``PublicEntry`` says where the route listens, the token it
requires and the certificate it serves; every other service listens on loopback without token or
TLS, whatever the environment or a ``--config`` file says, since the route's calls to them carry
no client credentials of their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from epd.common.advertise import endpoint, is_wildcard, primary_address
from epd.common.flags import flag

LOOPBACK = "127.0.0.1"
# Server flags every internal service gets on its command line (which wins over EPD_* and files).
INTERNAL_SERVER_ARGS = (
    *("--host", LOOPBACK, "--advertise-host", "", "--auth-token", ""),
    *("--tls-cert", "", "--tls-key", "", "--tls-client-ca", ""),
)
# The variables of those flags: ``epd up`` reads them for the route and keeps them from children.
ENTRY_VARIABLES = (
    "EPD_HOST",
    "EPD_ADVERTISE_HOST",
    "EPD_AUTH_TOKEN",
    "VLLM_API_KEY",
    "EPD_TLS_CERT",
    "EPD_TLS_KEY",
    "EPD_TLS_CLIENT_CA",
    "EPD_TLS_CA",
)
TOKEN = re.compile(r"[!-~]+")  # printable ASCII without spaces: it travels in a header


@dataclass(frozen=True, slots=True)
class PublicEntry:
    """Where the route listens (``host``; a wildcard is every interface), the bearer token it
    requires on gRPC and HTTP (None: none) and the TLS certificate and key it serves (None:
    plaintext). ``tls_ca_file``: what the launcher checks the route's certificate with (default
    the certificate itself, right for a self-signed one). ValueError when inconsistent."""

    host: str = field(
        default=LOOPBACK,
        metadata=flag(
            "address the route listens on (its metrics port too): an address of this host, or "
            "0.0.0.0 or :: for every interface, then printed as this host's primary address",
            env="EPD_HOST",
        ),
    )
    auth_token: str | None = field(
        default=None,
        metadata=flag(
            "the route requires 'authorization: Bearer TOKEN' on gRPC and HTTP (health checks "
            "excepted); printable ASCII without spaces; the demo request sends it",
            env="EPD_AUTH_TOKEN",
            aliases=("api-key",),
            also_env=("VLLM_API_KEY",),
        ),
    )
    tls_cert_file: str | None = field(
        default=None,
        metadata=flag(
            "PEM certificate chain: the route serves gRPC and HTTPS with it",
            env="EPD_TLS_CERT",
            name="tls-cert",
        ),
    )
    tls_key_file: str | None = field(
        default=None,
        metadata=flag("PEM private key of --tls-cert", env="EPD_TLS_KEY", name="tls-key"),
    )
    tls_ca_file: str | None = field(
        default=None,
        metadata=flag(
            "PEM CA the launcher checks the route's certificate with, reaching it at --host (at "
            "localhost when --host is a wildcard: the certificate must name it)",
            env="EPD_TLS_CA",
            default_help="default --tls-cert, right for a self-signed certificate",
        ),
    )

    def __post_init__(self) -> None:
        if self.auth_token is not None and not TOKEN.fullmatch(self.auth_token):
            raise ValueError("--auth-token: printable ASCII without spaces, please")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_ca_file and not self.tls_cert_file:
            raise ValueError("--tls-ca-file checks the route's certificate: give --tls-cert too")

    @property
    def is_tls(self) -> bool:
        """Whether the route serves TLS (gRPC and HTTPS)."""
        return bool(self.tls_cert_file)

    @property
    def ca_file(self) -> str | None:
        """The CA the launcher verifies the route with (None: plaintext)."""
        return (self.tls_ca_file or self.tls_cert_file) if self.is_tls else None

    @property
    def dial_host(self) -> str:
        """Where the launcher reaches the route: ``host``, or localhost when it is a wildcard (a
        TLS certificate must name it)."""
        return "localhost" if is_wildcard(self.host) else self.host

    def public_host(self) -> str:
        """The address other machines reach the route at: ``host``, or when it is a wildcard this
        host's primary address (``dial_host`` where there is none but loopback)."""
        if not is_wildcard(self.host):
            return self.host
        try:
            return primary_address()
        except ValueError:
            return self.dial_host

    def public_endpoint(self, port: int) -> str:
        """host:port of the route's gRPC port for other machines."""
        return endpoint(self.public_host(), port)

    def http_url(self, port: int) -> str:
        """The OpenAI base URL of the route's HTTP ``port`` for other machines."""
        scheme = "https" if self.is_tls else "http"
        return f"{scheme}://{endpoint(self.public_host(), port)}/v1"

    def route_args(self) -> list[str]:
        """The route's server flags. Its token goes by ``route_env``, out of ``ps``' sight; without
        one, ``--auth-token ''`` keeps a ``--config`` file's from it."""
        no_token = [] if self.auth_token else ["--auth-token", ""]
        return [
            *("--host", self.host, "--advertise-host", "", *no_token),
            *("--tls-cert", self.tls_cert_file or "", "--tls-key", self.tls_key_file or ""),
            *("--tls-client-ca", ""),
        ]

    def route_env(self) -> dict[str, str]:
        """Variables the route gets beyond every child's."""
        return {"EPD_AUTH_TOKEN": self.auth_token} if self.auth_token else {}

    def chat_command(self, port: int) -> str:
        """The ``epd chat`` line that reaches the route from another machine."""
        command = f"epd chat --endpoint {self.public_endpoint(port)}"
        if self.is_tls:
            command += f" --tls-ca-file {self.ca_file}"
        if self.auth_token:
            command += " --auth-token TOKEN"
        return f"{command} --image PATH 'question'"


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of the route's settings (``ENTRY_VARIABLES``)."""
    return {k: v for k, v in environ.items() if k not in ENTRY_VARIABLES}
