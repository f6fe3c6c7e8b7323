"""The NIXL handshake port a KV-transfer engine is given."""

from __future__ import annotations

import socket
from pathlib import Path

from epd.server.engine.vllm_process import EPHEMERAL_FLOOR, side_channel_port


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    """Ports from the ephemeral range were taken by other sockets between choosing and binding,
    and vLLM's handshake listener then hung the engine's start."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {side_channel_port("127.0.0.1") for _ in range(20)}
    assert all(EPHEMERAL_FLOOR <= port < low for port in ports)
    assert len(ports) > 1
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", ports.pop()))
