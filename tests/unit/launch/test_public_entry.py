"""``epd up --host/--auth-token/--tls-*``: the route gets them, the other services never do, and
bad values are usage errors before anything starts."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
from pathlib import Path

import pytest

from epd.common.server_cli import add_server_arguments, server_options
from epd.launch import up_cli
from epd.launch.launcher import Child, Deployment, start_topology
from epd.launch.public_entry import INTERNAL_SERVER_ARGS, PublicEntry, child_env
from epd.launch.topology import Topology
from tests.grpc.common.servicers import self_signed_cert


class Unstarted(Deployment):
    """A deployment that records the children it would start, healthy at once."""

    def _spawn(
        self, command: list[str], log: Path, mode: str, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        return None  # type: ignore[return-value]

    async def wait_healthy(self, child: Child, timeout_s: float) -> None:
        return None


def plan(tmp_path: Path, entry: PublicEntry) -> dict[str, Child]:
    deployment = Unstarted(tmp_path, {})
    asyncio.run(start_topology(deployment, tmp_path, "tiny", Topology("e-pd"), entry))
    return {child.name: child for child in deployment.children}


def flag(command: list[str], name: str) -> str:
    """The last value of ``name`` on ``command`` (argparse's winner)."""
    return [command[i + 1] for i, arg in enumerate(command) if arg == name][-1]


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_the_route_alone_listens_publicly_with_the_token_and_the_certificate(
    tmp_path: Path,
) -> None:
    cert, key = self_signed_cert(tmp_path)
    children = plan(tmp_path, PublicEntry("0.0.0.0", "s3cret", cert, key))
    route = children.pop("route")
    assert (flag(route.command, "--host"), flag(route.command, "--tls-cert")) == ("0.0.0.0", cert)
    assert flag(route.command, "--tls-key") == key and "--auth-token" not in route.command
    assert "s3cret" not in " ".join(route.command)  # NOTE: out of ps' sight
    assert route.env == {"EPD_AUTH_TOKEN": "s3cret"}
    assert (route.endpoint, route.tls.ca_file) == (f"localhost:{route.port}", cert)
    assert set(children) == {"scheduler", "prefill", "encode0"}
    for child in children.values():
        assert flag(child.command, "--host") == "127.0.0.1" and child.env == {}
        for name in ("--auth-token", "--tls-cert", "--tls-key", "--tls-client-ca"):
            assert flag(child.command, name) == ""
        assert child.endpoint == f"127.0.0.1:{child.port}" and child.tls.ca_file is None


def test_without_a_token_the_route_takes_none_from_a_config_file(tmp_path: Path) -> None:
    route = plan(tmp_path, PublicEntry())["route"]
    assert flag(route.command, "--auth-token") == "" and route.env == {}
    assert flag(route.command, "--host") == "127.0.0.1"
    assert route.endpoint == f"127.0.0.1:{route.port}"
    assert route.tls.ca_file is None


def test_the_internal_flags_give_a_plaintext_loopback_server_without_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("EPD_HOST", "EPD_AUTH_TOKEN", "EPD_TLS_CERT", "EPD_TLS_KEY"):
        monkeypatch.setenv(name, "from-the-environment")
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    options = server_options(parser.parse_args(list(INTERNAL_SERVER_ARGS)))
    assert options.host == "127.0.0.1" and options.auth_token is None
    assert (options.tls.cert_file, options.tls.key_file, options.advertise_host) == (None,) * 3


def test_children_do_not_inherit_the_route_settings_of_the_environment() -> None:
    environ = {"EPD_AUTH_TOKEN": "t", "EPD_HOST": "0.0.0.0", "EPD_TLS_CERT": "c", "PATH": "/bin"}
    assert child_env(environ) == {"PATH": "/bin"}


def test_the_flags_fall_back_to_their_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed_cert(tmp_path)
    for name, value in [("HOST", "0.0.0.0"), ("AUTH_TOKEN", "s3cret"), ("TLS_CERT", cert)]:
        monkeypatch.setenv(f"EPD_{name}", value)
    monkeypatch.setenv("EPD_TLS_KEY", key)
    entry = up_cli.public_entry(parse())
    assert entry == PublicEntry("0.0.0.0", "s3cret", cert, key)
    assert (entry.ca_file, entry.http_url(8000).startswith("https://")) == (cert, True)
    chat = entry.chat_command(1)
    assert f"--tls-ca-file {cert}" in chat and "--auth-token TOKEN" in chat and "s3cret" not in chat


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--host", "192.0.2.7"), "--host '192.0.2.7': not an address of this host"),
        (("--host", "nowhere.invalid"), "not an address of this host"),
        (("--auth-token", "two words"), "--auth-token: printable ASCII without spaces"),
        (("--tls-cert", "CERT"), "--tls-cert and --tls-key go together"),
        (("--tls-key", "KEY"), "--tls-cert and --tls-key go together"),
        (("--tls-cert", "missing.pem", "--tls-key", "KEY"), "--tls-cert missing.pem: no such"),
        (("--tls-ca-file", "CERT"), "give --tls-cert too"),
    ],
)
def test_bad_entry_settings_are_usage_errors_before_anything_starts(
    flags: tuple[str, ...],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cert, key = self_signed_cert(tmp_path)
    flags = tuple(cert if f == "CERT" else key if f == "KEY" else f for f in flags)
    monkeypatch.setattr(up_cli, "_up", pytest.fail)
    assert up_cli.run(parse(*flags, "--model", "nowhere", "--device", "cpu")) == 2
    assert message in capsys.readouterr().err
