"""Server flags: EPD_* fallbacks, checked values, and the keepalive reaching channels and servers
alike (a server must accept the pings of channels made with the same setting)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from epd.common.channels import keepalive_options, server_ping_options
from epd.common.server import ServerOptions, build_server
from epd.common.server_cli import add_server_arguments, serve_announced, server_options
from epd.common.server_tls import ServerTls
from epd.common.serving import stop_signals


def parse(argv: list[str]) -> ServerOptions:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser, default_port=50051)
    return server_options(parser.parse_args(argv))


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EPD_GRPC_KEEPALIVE_S", "EPD_PORT", "EPD_HOST"):
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_the_options_defaults_but_the_port() -> None:
    assert parse([]) == ServerOptions(port=50051)


def test_keepalive_falls_back_to_its_variable_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPD_GRPC_KEEPALIVE_S", "1")
    assert parse([]).keepalive_s == 1.0
    assert parse(["--grpc-keepalive-s", "2.5"]).keepalive_s == 2.5
    monkeypatch.setenv("EPD_GRPC_KEEPALIVE_S", "soon")
    with pytest.raises(ValueError, match=r"\$EPD_GRPC_KEEPALIVE_S must be a number"):
        add_server_arguments(argparse.ArgumentParser())


def test_a_keepalive_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="keepalive must be positive"):
        parse(["--grpc-keepalive-s", "0"])


def test_tls_flags_fill_the_servers_tls_and_a_half_pair_is_refused() -> None:
    tls = parse(["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"]).tls
    assert tls == ServerTls(cert_file="c.pem", key_file="k.pem", client_ca_file="ca.pem")
    with pytest.raises(ValueError, match="certificate and a key"):
        parse(["--tls-cert", "c.pem"])
    with pytest.raises(ValueError, match="certificate and a key"):
        parse(["--tls-key", "k.pem"])
    with pytest.raises(ValueError, match="mTLS"):
        parse(["--tls-client-ca", "ca.pem"])


def test_servers_accept_pings_as_often_as_channels_send_them() -> None:
    channel = dict(keepalive_options(1.5))
    server = dict(server_ping_options(1.5))
    assert channel["grpc.keepalive_time_ms"] == channel["grpc.keepalive_timeout_ms"] == 1500
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < 1500


async def test_a_served_server_announces_its_address_then_drains_on_stop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ServerOptions(host="127.0.0.1", port=0)
    server, port = await build_server([], options)
    with stop_signals() as stop:
        stop.requested.set()
        await serve_announced("holder", server, port, stop, host=options.host, detail=" (x)")
    assert capsys.readouterr().out == f"epd holder listening on 127.0.0.1:{port} (x)\n"
    await asyncio.wait_for(server.wait_for_termination(), timeout=5)  # drained: it stopped
