"""How the egress proxy turns a host name into the addresses it may connect to.

The proxy resolves every name itself and connects to exactly the address it checked, so a
second lookup (by a library, or a rebinding DNS server) never decides where bytes go. The
resolver is injectable: `SystemResolver` asks the host's resolver (getaddrinfo, off the
proxy's loop), `StaticResolver` answers from a fixed table.

A `Resolution` is ``pinned`` when the operator wrote the answer down (a `StaticResolver`
table, like an /etc/hosts entry handed to the proxy): the command's author cannot influence
it, so the proxy does not apply the public-address rule to it. Answers from DNS are never
pinned.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class ResolutionError(OSError):
    """The name has no address (or the resolver failed); nothing was connected."""


@dataclass(frozen=True)
class Resolution:
    """The addresses of one name, in the order to try them."""

    addresses: tuple[IPAddress, ...]
    pinned: bool = False


class Resolver(Protocol):
    """Anything that resolves a host name (ASCII, lowercase, no trailing dot)."""

    async def resolve(self, name: str) -> Resolution: ...


def _unwrap(address: IPAddress) -> IPAddress:
    # An IPv4-mapped answer is the IPv4 address: judged and connected to as such.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _unique(addresses: Iterable[IPAddress]) -> tuple[IPAddress, ...]:
    return tuple(dict.fromkeys(_unwrap(a) for a in addresses))


class SystemResolver:
    """The host's resolver through `getaddrinfo`, which runs in the loop's default executor."""

    async def resolve(self, name: str) -> Resolution:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ResolutionError(exc.errno, f"cannot resolve {name}: {exc.strerror}") from None
        # Scoped link-local answers ("fe80::1%eth0") are refused later anyway; drop the scope.
        addresses = _unique(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
        if not addresses:
            raise ResolutionError(0, f"cannot resolve {name}: no address")
        return Resolution(addresses)


class StaticResolver:
    """A fixed table ``name -> address(es)``; names not in it go to ``fallback`` or fail.

    ``pinned=True`` (the default) marks the table as the operator's own: its answers skip the
    public-address rule. ``pinned=False`` makes it behave like DNS (tests use it to play a
    DNS server that answers with a private address).
    """

    def __init__(
        self,
        table: Mapping[str, str | Iterable[str]],
        *,
        pinned: bool = True,
        fallback: Resolver | None = None,
    ) -> None:
        self._table: dict[str, tuple[IPAddress, ...]] = {}
        for name, value in table.items():
            values = (value,) if isinstance(value, str) else tuple(value)
            self._table[name.lower().rstrip(".")] = _unique(ipaddress.ip_address(v) for v in values)
        self._pinned = pinned
        self._fallback = fallback

    async def resolve(self, name: str) -> Resolution:
        addresses = self._table.get(name)
        if addresses:
            return Resolution(addresses, pinned=self._pinned)
        if self._fallback is not None:
            return await self._fallback.resolve(name)
        raise ResolutionError(0, f"cannot resolve {name}: not in the static table")
