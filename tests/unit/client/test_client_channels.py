"""The blocking and the async SDK clients open their channels alike: for the same arguments, the
same target, TLS credentials and options (both from ``channels.channel_spec``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest

from epd.client.sdk import AsyncEpdClient
from epd.client.sync_client import EpdClient
from epd.common.channels import TlsFiles, channel_spec


class Opened:
    """Records the channels grpc is asked to open (blocking and aio) instead of opening them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, tuple[str, object, tuple[tuple[str, Any], ...]]] = {}
        # Credentials compare by the bytes they were built from.
        monkeypatch.setattr(grpc, "ssl_channel_credentials", lambda **files: tuple(files.items()))
        for module, kind in ((grpc, "blocking"), (grpc.aio, "aio")):
            monkeypatch.setattr(module, "insecure_channel", self._opener(kind, secure=False))
            monkeypatch.setattr(module, "secure_channel", self._opener(kind, secure=True))

    def _opener(self, kind: str, *, secure: bool) -> Any:
        def open_channel(target: str, *args: Any, **kwargs: Any) -> mock.MagicMock:
            credentials = args[0] if secure else None
            self.calls[kind] = (target, credentials, tuple(kwargs["options"]))
            return mock.MagicMock()

        return open_channel


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_bytes(f"{name} bytes".encode())
        files[f"tls_{name}_file"] = str(path)
    return files


@pytest.mark.parametrize(
    "tls", [(), ("tls_ca_file",), ("tls_ca_file", "tls_cert_file", "tls_key_file")]
)
def test_both_clients_open_the_same_channel(
    monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, str], tls: tuple[str, ...]
) -> None:
    opened = Opened(monkeypatch)
    arguments = {name: tls_files[name] for name in tls}

    EpdClient("route:50050", auth_token="t", **arguments)
    AsyncEpdClient("route:50050", auth_token="t", **arguments)

    assert opened.calls["blocking"] == opened.calls["aio"]
    target, credentials, options = opened.calls["aio"]
    files = TlsFiles(**{name.removeprefix("tls_"): path for name, path in arguments.items()})
    spec = channel_spec("route:50050", tls=files)
    assert (target, credentials, options) == (spec.target, spec.credentials, spec.options)
    assert (credentials is None) == (not tls)
    assert dict(options)["grpc.max_receive_message_length"] == 64 << 20
    assert "grpc.keepalive_time_ms" in dict(options)
