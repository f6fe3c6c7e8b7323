"""Free ports for the services a deployment starts on ports it chooses (``epd up`` without
``--base-port``, the store's master and holder, the benchmarks' servers)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from epd.launch.public_entry import LOOPBACK

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_PORTS = (32768, 60999)
# ports free_port chooses from, up to the ephemeral range (none of IANA's well-known services)
LOWEST_CHOSEN_PORT = 20000
FREE_PORT_TRIES = 64


def free_port() -> int:
    """A port nobody listens on right now, below the kernel's ephemeral range where there is
    one: outgoing connections take their local ports from that range, so a port chosen in it
    (as ``bind(0)`` chooses) may be taken by a connection before its service binds it; else
    one the kernel picks."""
    low = ephemeral_ports()[0]
    for _ in range(FREE_PORT_TRIES):
        port = random.randrange(LOWEST_CHOSEN_PORT, max(low, LOWEST_CHOSEN_PORT + 1))
        if port < low and _is_free(port):
            return port
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default where it
    cannot be read)."""
    try:
        low, high = Path(EPHEMERAL_RANGE_FILE).read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_PORTS


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True
