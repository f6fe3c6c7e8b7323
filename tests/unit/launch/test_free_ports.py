"""free_port chooses below the kernel's ephemeral range, where no outgoing connection takes a
port between its choice and its service's bind (CI saw a decode worker's metrics port and a
Mooncake master's port taken so, each failing a whole deployment's start)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from epd.launch import free_ports
from epd.launch.free_ports import LOWEST_CHOSEN_PORT, ephemeral_ports, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low, _ = ephemeral_ports()
    for _ in range(20):
        port = free_port()
        assert LOWEST_CHOSEN_PORT <= port < low
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        choices = iter([port, port, port + 1])
        monkeypatch.setattr(free_ports.random, "randrange", lambda *_: next(choices))
        monkeypatch.setattr(free_ports, "ephemeral_ports", lambda: (65535, 65535))
        assert free_port() != port


def test_without_room_below_the_range_the_kernel_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text(f"{LOWEST_CHOSEN_PORT}\t60999\n")
    monkeypatch.setattr(free_ports, "EPHEMERAL_RANGE_FILE", str(ranges))
    assert ephemeral_ports() == (LOWEST_CHOSEN_PORT, 60999)
    assert free_port() >= LOWEST_CHOSEN_PORT
    monkeypatch.setattr(free_ports, "EPHEMERAL_RANGE_FILE", str(tmp_path / "missing"))
    assert ephemeral_ports() == free_ports.DEFAULT_EPHEMERAL_PORTS
