"""Test servicers for the scaffold (real epd.v1 services with behaviour chosen per test) and
helpers such as self-signed certificates."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from epd.common import errors
from epd.common.server import ServiceBinding
from epd.common.status import handle_errors
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import encode_service_pb2_grpc as encode_grpc


class ScriptedEncodeService(encode_grpc.EncodeServiceServicer):  # type: ignore[misc]
    """Release raises ``release_error`` if set; Encode streams one response per item, pausing
    ``item_delay_s`` between items, and raises ``encode_error`` after the first item if set."""

    def __init__(self) -> None:
        self.release_error: Exception | None = None
        self.release_abort: grpc.StatusCode | None = None
        self.encode_error: Exception | None = None
        self.item_delay_s = 0.0
        self.on_release: Callable[[], Any] | None = None
        self.encode_exits: list[str] = []  # how each Encode stream ended: "done" or an exception

    @handle_errors
    async def Release(self, request: Any, context: Any) -> encode_pb.ReleaseResponse:
        if self.on_release is not None:
            await self.on_release()
        if self.release_abort is not None:
            await context.abort(self.release_abort, "aborted by the handler itself")
        if self.release_error is not None:
            raise self.release_error
        return encode_pb.ReleaseResponse(num_released=len(request.lease_ids))

    @handle_errors
    async def Encode(self, request: Any, context: Any) -> AsyncIterator[encode_pb.EncodeResponse]:
        try:
            for index, item in enumerate(request.items):
                if index and self.encode_error is not None:
                    raise self.encode_error
                await asyncio.sleep(self.item_delay_s)
                yield encode_pb.EncodeResponse(item_index=index, mm_hash=item.mm_hash)
            self.encode_exits.append("done")
        except BaseException as e:
            self.encode_exits.append(type(e).__name__)
            raise


def encode_binding(servicer: ScriptedEncodeService) -> ServiceBinding:
    return ServiceBinding(
        "epd.v1.EncodeService", servicer, encode_grpc.add_EncodeServiceServicer_to_server
    )


def errors_under_test() -> list[errors.EpdError]:
    return [
        errors.InvalidArgument("bad image", reason="IMAGE_TOO_LARGE", metadata={"limit": "10"}),
        errors.NotFound("lease gone", reason="LEASE_EXPIRED"),
        errors.ResourceExhausted("queue full", reason="QUEUE_FULL"),
        errors.Unavailable("no encoder", reason="NO_ENCODER"),
        errors.FailedPrecondition("wrong mode", reason="WRONG_MODE"),
    ]


def self_signed_cert(folder: Path, name: str = "localhost") -> tuple[str, str]:
    """Write a self-signed CA certificate for DNS ``name`` and its key; returns their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / f"{name}-cert.pem", folder / f"{name}-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)
