"""Workers register an address their peers can reach, never a wildcard."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from epd.common.advertise import (
    advertised_host,
    endpoint,
    is_wildcard,
    primary_address,
    source_address_towards,
)
from epd.common.server import ServerOptions

# NOTE: .invalid never resolves (RFC 2606)
UNRESOLVABLE = "scheduler.invalid:50051"


def test_a_wildcard_bind_without_a_scheduler_advertises_this_hosts_primary_address() -> None:
    for wildcard in ("0.0.0.0", "::", "[::]"):
        assert is_wildcard(wildcard)
        address = ipaddress.ip_address(advertised_host(wildcard, None, None))
        assert not address.is_unspecified and not address.is_loopback
    assert advertised_host("0.0.0.0", None, None) == primary_address()


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ("127.0.0.1:50051", "127.0.0.1"),
        ("localhost:50051", "127.0.0.1"),
        ("dns:///127.0.0.1:50051", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1"),
    ],
)
def test_a_wildcard_bind_advertises_its_route_towards_the_scheduler(
    scheduler: str, expected: str
) -> None:
    assert advertised_host("0.0.0.0", None, scheduler) == expected


def test_the_route_towards_a_scheduler_on_this_hosts_address_starts_at_that_address() -> None:
    primary = primary_address()
    assert source_address_towards(f"{primary}:50051") == primary
    assert advertised_host("::", None, f"{primary}:50051") == primary


def test_an_ipv6_scheduler_is_reached_from_an_ipv6_address_unless_bound_to_ipv4_only() -> None:
    if source_address_towards("[::1]:50051") is None:
        pytest.skip("no IPv6 loopback here")
    assert advertised_host("::", None, "[::1]:50051") == "::1"
    assert source_address_towards("[::1]:50051", socket.AF_INET) is None
    assert advertised_host("0.0.0.0", None, "[::1]:50051") == primary_address()


@pytest.mark.parametrize("scheduler", [UNRESOLVABLE, "unix:/run/epd/scheduler.sock", ""])
def test_a_scheduler_without_a_route_leaves_this_hosts_primary_address(scheduler: str) -> None:
    assert source_address_towards(scheduler) is None
    assert advertised_host("0.0.0.0", None, scheduler) == primary_address()


def test_a_specific_bind_host_or_an_explicit_one_is_advertised_as_given() -> None:
    assert advertised_host("127.0.0.1", None, None) == "127.0.0.1"
    assert advertised_host("192.0.2.7", None, "127.0.0.1:50051") == "192.0.2.7"
    assert advertised_host("0.0.0.0", "encoder-7.internal", None) == "encoder-7.internal"
    assert advertised_host("0.0.0.0", "encoder-7.internal", "127.0.0.1:1") == "encoder-7.internal"
    options = ServerOptions(host="0.0.0.0", advertise_host="10.1.2.3")
    assert options.advertised_endpoint(5000, "127.0.0.1:50051") == "10.1.2.3:5000"
    assert options.advertised_endpoint(5000, UNRESOLVABLE) == "10.1.2.3:5000"
    assert ServerOptions(host="::1").advertised_endpoint(5000, None) == "[::1]:5000"
    assert ServerOptions(host="0.0.0.0").advertised_endpoint(5000, "[::1]:1") != "[::1]:5000"
    assert endpoint("fd00::2", 7) == "[fd00::2]:7"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_advertising_a_wildcard_is_refused(wildcard: str) -> None:
    with pytest.raises(ValueError, match="is a wildcard"):
        ServerOptions(advertise_host=wildcard)
