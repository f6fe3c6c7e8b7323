"""A server's TLS settings, carried once for both of a service's ports: the gRPC port takes its
credentials (``credentials``), the route's OpenAI HTTP port its SSL context (``ssl_context``).
The client side of a channel is ``channels.TlsFiles``."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from epd.common.flags import flag


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The PEM files a server's TLS is made of; none given: plaintext. ``cert_file`` +
    ``key_file``: the server's certificate chain and key; ``client_ca_file``: requires client
    certificates and verifies them with it (mTLS). ValueError for a half pair."""

    cert_file: str | None = field(
        default=None,
        metadata=flag(
            "PEM certificate chain; serves TLS when set", env="EPD_TLS_CERT", name="tls-cert"
        ),
    )
    key_file: str | None = field(
        default=None,
        metadata=flag("PEM private key for --tls-cert", env="EPD_TLS_KEY", name="tls-key"),
    )
    client_ca_file: str | None = field(
        default=None,
        metadata=flag(
            "PEM CA bundle; requires and verifies client certificates (mTLS) when set",
            env="EPD_TLS_CLIENT_CA",
            name="tls-client-ca",
        ),
    )

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("TLS needs both a certificate and a key file")
        if self.client_ca_file and not self.cert_file:
            raise ValueError("mTLS (a client CA) needs the server's own certificate and key")

    @property
    def is_on(self) -> bool:
        """Whether the server serves TLS (a certificate and key are given)."""
        return bool(self.cert_file)

    def credentials(self) -> grpc.ServerCredentials | None:
        """The gRPC server credentials of these files, read now (None: plaintext)."""
        if not (self.cert_file and self.key_file):
            return None
        client_ca = _read(self.client_ca_file)
        return grpc.ssl_server_credentials(
            [(Path(self.key_file).read_bytes(), Path(self.cert_file).read_bytes())],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The SSL context of these files for an HTTP server, read now (None: plaintext)."""
        if not self.cert_file:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None
