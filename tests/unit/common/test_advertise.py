"""Workers register an address their peers can reach, never a wildcard."""

from __future__ import annotations

import ipaddress

import pytest

from epd.common.advertise import advertised_host, endpoint, is_wildcard, primary_address
from epd.common.server import ServerOptions


def test_a_wildcard_bind_advertises_this_hosts_primary_address() -> None:
    for wildcard in ("0.0.0.0", "::", "[::]"):
        assert is_wildcard(wildcard)
        address = ipaddress.ip_address(advertised_host(wildcard, None))
        assert not address.is_unspecified and not address.is_loopback
    assert advertised_host("0.0.0.0", None) == primary_address()


def test_a_specific_bind_host_or_an_explicit_one_is_advertised_as_given() -> None:
    assert advertised_host("127.0.0.1", None) == "127.0.0.1"
    assert advertised_host("0.0.0.0", "encoder-7.internal") == "encoder-7.internal"
    options = ServerOptions(host="0.0.0.0", advertise_host="10.1.2.3")
    assert options.advertised_endpoint(5000) == "10.1.2.3:5000"
    assert ServerOptions(host="::1").advertised_endpoint(5000) == "[::1]:5000"
    assert endpoint("fd00::2", 7) == "[fd00::2]:7"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_advertising_a_wildcard_is_refused(wildcard: str) -> None:
    with pytest.raises(ValueError, match="is a wildcard"):
        ServerOptions(advertise_host=wildcard)
