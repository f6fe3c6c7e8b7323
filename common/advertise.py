"""The address a worker registers with the scheduler: one its peers can reach.

A server bound to a wildcard (``0.0.0.0``, ``::``) listens everywhere but cannot be reached at
that address; it advertises ``--advertise-host`` when given, else this host's primary address:
the source address of its default route (found by connecting a UDP socket, which sends nothing),
or failing that the first non-loopback address its host name resolves to.
"""

from __future__ import annotations

import ipaddress
import socket

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
# NOTE: TEST-NET-1 (RFC 5737): only used for a routing lookup; no packet is ever sent to it.
_ROUTE_PROBE = ("192.0.2.1", 9)


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means every interface rather than one address."""
    return host.strip() in WILDCARDS


def primary_address() -> str:
    """This host's primary IPv4 address; ValueError if it has none but loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(_ROUTE_PROBE)
            address = str(probe.getsockname()[0])
        except OSError:
            address = ""
    if _is_reachable(address):
        return address
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    for info in infos:
        candidate = str(info[4][0])
        if _is_reachable(candidate):
            return candidate
    raise ValueError(
        "this host has no address but loopback to advertise; set --advertise-host "
        "(env EPD_ADVERTISE_HOST) to the address peers reach this worker at"
    )


def advertised_host(bind_host: str, advertise_host: str | None) -> str:
    """What a worker bound to ``bind_host`` registers: ``advertise_host`` if given, the bind
    host if it is one address, else this host's primary address."""
    if advertise_host:
        return advertise_host
    return primary_address() if is_wildcard(bind_host) else bind_host


def endpoint(host: str, port: int) -> str:
    """host:port, an IPv6 host bracketed."""
    bare = host.strip("[]")
    if ":" in bare:
        return f"[{bare}]:{port}"
    return f"{host}:{port}"


def _is_reachable(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return not (parsed.is_loopback or parsed.is_unspecified)
