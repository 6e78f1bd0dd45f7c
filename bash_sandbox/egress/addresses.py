"""Which resolved addresses the egress proxy refuses to connect to, and why.

A name on the allowlist may resolve anywhere: a hostile DNS answer (or a rebinding one) can
point it at the host's own services, the LAN or a cloud metadata endpoint. So every address
a name resolves to must be globally routable unicast. IPv6 forms that carry an IPv4 address
(IPv4-mapped, IPv4-compatible, 6to4, NAT64 well-known prefix, Teredo) are judged by the IPv4
address inside them too, since a dual-stack kernel or a translator delivers to that address.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud instance-metadata endpoints outside the ranges refused below (AWS IPv6 IMDS is in
# fc00::/7 and Alibaba's in CGNAT space anyway; listed so the reason names them).
_METADATA: Final = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
_CGNAT: Final = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE: Final = ipaddress.IPv6Network("::/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to, when it carries one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # (server, client): traffic goes to the client
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _IPV4_COMPATIBLE and int(address) > 1:  # :: and ::1 are not compatible forms
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _category(address: IPAddress) -> str | None:
    """The kind of non-public address ``address`` is, or None when it is public unicast."""
    if address in _METADATA:
        return "cloud metadata"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv4Address):
        if address in _CGNAT:
            return "CGNAT (shared address space)"
        if address == ipaddress.IPv4Address("255.255.255.255"):
            return "broadcast"
    elif address.is_site_local or address in _NAT64_LOCAL:
        return "private"
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "reserved"
    return None


# Where only an operator's pin may send a name (never a DNS answer, whatever
# `allow_private_domains` says): the host itself, instance metadata and the link.
_PIN_ONLY: Final = frozenset(
    {"cloud metadata", "unspecified", "loopback", "link-local", "multicast", "broadcast"}
)


def needs_pin(address: IPAddress) -> bool:
    """Only a pinned answer may lead to ``address`` (loopback, metadata, link-local, ...);
    judged by the IPv4 address it carries too."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None and _category(inner) in _PIN_ONLY:
            return True
    return _category(address) in _PIN_ONLY


def forbidden_address_reason(address: IPAddress, *, loopback_named: bool = False) -> str | None:
    """Why the proxy must not connect to ``address`` ("loopback", "private", ...), or None.

    ``loopback_named``: the rule that matched names `localhost`, so loopback is allowed (and
    only loopback: a `localhost` rule never opens private or metadata addresses).
    """
    if isinstance(address, ipaddress.IPv6Address):
        # The carried IPv4 address first: it is where the packets end up.
        inner = _embedded_ipv4(address)
        inner_category = _category(inner) if inner is not None else None
        if inner_category is not None:
            return f"{inner_category}, via the IPv4 address {inner} it carries"
        if inner is not None and (address.ipv4_mapped or address.sixtofour or address in _NAT64):
            return None  # delivers to a public IPv4 address (DNS64 answers look like this)
    category = _category(address)
    if category == "loopback" and loopback_named:
        return None
    return category


def is_own_address(address: IPAddress) -> bool:
    """Whether ``address`` is one of this host's own (of the network namespace calling):
    the kernel routes it locally, so a connection there reaches the host's services bound to
    every interface, as loopback would. Asked of the routing table with an unsent UDP
    connect: only for a local destination is the chosen source the destination itself."""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((str(address), 9))
            source = str(probe.getsockname()[0]).split("%")[0]
    except OSError:
        return False  # no route: nothing of the host's is reached there either
    return ipaddress.ip_address(source) == address
