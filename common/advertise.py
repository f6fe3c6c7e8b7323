"""The address a worker registers with the scheduler: one its peers can reach.

A server bound to a wildcard (``0.0.0.0``, ``::``) listens everywhere but cannot be reached at
that address; it advertises ``--advertise-host`` when given, else the source address of this
host's route towards its scheduler (the address the scheduler's host, and so every peer that
reaches the scheduler, sees it at), else this host's primary address: the source address of its
default route, or failing that the first non-loopback address its host name resolves to. Routes
are found by connecting a UDP socket, which sends nothing.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
# NOTE: TEST-NET-1 (RFC 5737): only used for a routing lookup; no packet is ever sent to it.
_ROUTE_PROBE = ("192.0.2.1", 9)
_GRPC_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")

logger = logging.getLogger(__name__)


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


def source_address_towards(target: str, family: int = socket.AF_UNSPEC) -> str | None:
    """The source address of this host's route towards ``target`` (a gRPC target such as
    host:port, its name resolved first), of ``family`` when given; None when the name does not
    resolve or no route leads to any of its addresses. Sends nothing."""
    host_port = _split_target(target)
    if host_port is None:
        return None
    try:
        infos = socket.getaddrinfo(*host_port, family, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for info_family, kind, protocol, _, address in infos:
        with socket.socket(info_family, kind, protocol) as probe:
            try:
                probe.connect(address)
                source = str(probe.getsockname()[0])
            except OSError:
                continue
        if not ipaddress.ip_address(source).is_unspecified:
            return source
    return None


def advertised_host(bind_host: str, advertise_host: str | None, scheduler: str | None) -> str:
    """What a worker bound to ``bind_host`` and registering with ``scheduler`` (None: none)
    registers: ``advertise_host`` if given, the bind host if it is one address, else the source
    address of the route towards the scheduler, else this host's primary address. ValueError
    when it comes to the primary address and this host has none."""
    if advertise_host:
        return advertise_host
    if not is_wildcard(bind_host):
        return bind_host
    if scheduler:
        family = socket.AF_INET if bind_host.strip() == "0.0.0.0" else socket.AF_UNSPEC
        source = source_address_towards(scheduler, family)
        if source is not None:
            return source
        logger.warning(
            "no route towards scheduler %s (or its name does not resolve); advertising this "
            "host's primary address",
            scheduler,
        )
    return primary_address()


def is_local_address(host: str) -> bool:
    """Whether a server can listen on ``host``: a wildcard, or a name or address of this host."""
    bare = host.strip().strip("[]")
    if not bare:
        return False
    try:
        infos = socket.getaddrinfo(bare, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False
    for family, kind, protocol, _, address in infos:
        with socket.socket(family, kind, protocol) as probe:
            try:
                probe.bind(address)
            except OSError:
                continue
        return True
    return False


def endpoint(host: str, port: int) -> str:
    """host:port, an IPv6 host bracketed."""
    bare = host.strip("[]")
    if ":" in bare:
        return f"[{bare}]:{port}"
    return f"{host}:{port}"


def _split_target(target: str) -> tuple[str, int] | None:
    """(host, port) of a gRPC target naming one host; None for other targets (unix sockets)."""
    for scheme in _GRPC_SCHEMES:
        target = target.removeprefix(scheme)
    if target.startswith("unix"):
        return None
    if target.startswith("["):
        host, _, port = target[1:].partition("]")
        port = port.removeprefix(":")
    elif target.count(":") == 1:
        host, port = target.split(":")
    else:
        host, port = target, ""
    if not host:
        return None
    return host, int(port) if port.isdigit() else _ROUTE_PROBE[1]


def _is_reachable(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return not (parsed.is_loopback or parsed.is_unspecified)
