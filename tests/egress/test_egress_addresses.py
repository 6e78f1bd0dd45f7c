"""Which resolved addresses the proxy refuses (IPv4, IPv6 and IPv6 forms carrying IPv4)."""

from __future__ import annotations

import ipaddress

import pytest

from bash_sandbox.egress.addresses import forbidden_address_reason


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("127.0.0.1", "loopback"),
        ("127.3.4.5", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.170.2", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "CGNAT"),
        ("100.100.100.200", "cloud metadata"),
        ("224.0.0.251", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("fec0::1", "private"),
        ("fd00:ec2::254", "cloud metadata"),
        ("ff02::1", "multicast"),
        # IPv6 forms that deliver to an IPv4 address are judged by that address.
        ("::ffff:127.0.0.1", "loopback, via the IPv4 address 127.0.0.1"),
        ("::ffff:169.254.169.254", "cloud metadata, via"),
        ("::127.0.0.1", "loopback, via"),
        ("2002:7f00:1::", "loopback, via"),
        ("2002:a00:1::1", "private, via the IPv4 address 10.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "cloud metadata, via"),
        ("64:ff9b::7f00:1", "loopback, via"),
        ("64:ff9b:1::a00:1", "private"),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "private"),  # Teredo to 10.0.0.1
        ("::8.8.8.8", "reserved"),  # the deprecated compatible form, even of a public one
    ],
)
def test_non_public_addresses_are_refused_with_their_category(address: str, category: str) -> None:
    reason = forbidden_address_reason(ipaddress.ip_address(address))
    assert reason is not None
    assert reason.startswith(category)


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ],
)
def test_public_unicast_is_allowed(address: str) -> None:
    assert forbidden_address_reason(ipaddress.ip_address(address)) is None


def test_localhost_rule_allows_loopback_only() -> None:
    for loopback in ("127.0.0.1", "::1"):
        assert forbidden_address_reason(ipaddress.ip_address(loopback), loopback_named=True) is None
    for other in ("10.0.0.1", "169.254.169.254", "::ffff:127.0.0.1"):
        assert forbidden_address_reason(ipaddress.ip_address(other), loopback_named=True)


def test_own_addresses_are_told_from_others_by_the_routing_table() -> None:
    from bash_sandbox.egress.addresses import is_own_address

    assert is_own_address(ipaddress.ip_address("127.0.0.1"))
    assert is_own_address(ipaddress.ip_address("::1"))
    assert not is_own_address(ipaddress.ip_address("203.0.113.7"))  # TEST-NET-3: nobody's
