"""How the egress proxy turns a host name into the addresses it may connect to.

The proxy resolves every name itself and connects to exactly the address it checked, so a
second lookup (by a library, or a rebinding DNS server) never decides where bytes go. The
resolver is injectable: `SystemResolver` asks the host's resolver (getaddrinfo, off the
proxy's loop), `StaticResolver` answers from a fixed table.

A `Resolution` is ``pinned`` when the operator wrote the answer down (the executor's `pin`
table, the hosts file, a `StaticResolver` table): the command's author cannot influence it,
so the proxy does not apply the public-address rule to it, and ``source`` says where it was
written (the facts name it). Answers from DNS are never pinned. `PinnedResolver` is what
the executor uses: its pins, then the hosts file (re-read when it changes), then DNS.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import threading
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
    source: str | None = None  # where a pinned answer was written ("pin", "/etc/hosts")


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
            source = "the resolver's table" if self._pinned else None
            return Resolution(addresses, pinned=self._pinned, source=source)
        if self._fallback is not None:
            return await self._fallback.resolve(name)
        raise ResolutionError(0, f"cannot resolve {name}: not in the static table")


# A hosts file larger than this is not read (and nothing in it is pinned).
MAX_HOSTS_BYTES = 1 << 20
DEFAULT_HOSTS_FILE = "/etc/hosts"


def parse_hosts(text: str) -> dict[str, tuple[IPAddress, ...]]:
    """``name -> addresses`` of a hosts file (hosts(5)), in file order. Multicast entries
    (``ff02::1 ip6-allnodes``) are skipped; unspecified ones (``0.0.0.0 ads.example``, a
    block list) are kept so the name is answered as blocked, never looked up elsewhere."""
    table: dict[str, list[IPAddress]] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = _unwrap(ipaddress.ip_address(fields[0].split("%")[0]))
        except ValueError:
            continue
        if address.is_multicast:
            continue
        for name in fields[1:]:
            entry = table.setdefault(name.lower().rstrip("."), [])
            if address not in entry:
                entry.append(address)
    return {name: tuple(addresses) for name, addresses in table.items()}


class HostsFile:
    """One hosts file, re-read when its size or modification time changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._table: dict[str, tuple[IPAddress, ...]] = {}

    def lookup(self, name: str) -> tuple[IPAddress, ...]:
        try:
            st = os.stat(self.path)
        except OSError:
            return ()
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if stamp != self._stamp:
                self._table = self._read(st.st_size)
                self._stamp = stamp
            return self._table.get(name, ())

    def _read(self, size: int) -> dict[str, tuple[IPAddress, ...]]:
        if size > MAX_HOSTS_BYTES:
            return {}
        try:
            with open(self.path, "rb") as fh:
                return parse_hosts(fh.read(MAX_HOSTS_BYTES).decode("utf-8", "replace"))
        except OSError:
            return {}


class PinnedResolver:
    """The operator's answers first, DNS for the rest.

    ``pins`` (``name -> addresses``, canonical as `policies.egress.canonical_pins` makes
    them) win; then ``hosts_file`` (None: none); both are pinned and name their source. A
    name pinned to an unspecified address (``0.0.0.0``, a hosts-file block) is not resolved
    at all. Everything else goes to ``fallback`` (default `SystemResolver`), unpinned.
    """

    def __init__(
        self,
        pins: Mapping[str, Iterable[str]] | None = None,
        *,
        hosts_file: str | None = DEFAULT_HOSTS_FILE,
        fallback: Resolver | None = None,
    ) -> None:
        self._pins = {
            name.lower().rstrip("."): _unique(ipaddress.ip_address(a) for a in addresses)
            for name, addresses in (pins or {}).items()
        }
        self._hosts = HostsFile(hosts_file) if hosts_file is not None else None
        self._fallback: Resolver = fallback if fallback is not None else SystemResolver()

    async def resolve(self, name: str) -> Resolution:
        pinned = self._pins.get(name)
        source = "pin"
        if not pinned and self._hosts is not None:
            pinned = self._hosts.lookup(name)  # a stat, and a small read when it changed
            source = self._hosts.path
        if pinned:
            if any(a.is_unspecified for a in pinned):
                raise ResolutionError(0, f"cannot resolve {name}: blocked in {source}")
            return Resolution(pinned, pinned=True, source=source)
        return await self._fallback.resolve(name)
