"""Network hints: what a refused connect or lookup was about, beyond the address refused.

Two things a user needs next and no denial says:

- A connect to ``127.0.0.1:<port>`` from a command with its own network namespace reaches
  the sandbox's loopback, where nothing listens: "connection refused", and no denial
  (nothing was refused by the sandbox). When the *host* listens on that port, the user's
  database or dev server is the thing they meant: `loopback_hints` says so. Whether the
  host listens is read from ``/proc/net/tcp{,6}`` of the executor's (the host's) network
  namespace: cheap, and it sends no traffic.
- A refused lookup is recorded as a connect to the resolver (``10.0.0.2:53``); the name
  asked for is in the DNS query, which is never sent. The output usually names it
  (``Could not resolve host: example.com``): `resolve_hints` points at it, next to the
  supervisor's witnessed denial and only when there is one.

The loopback destinations come from the supervisor's records when it keeps them (see
`loopback_hints`) and otherwise from the output (`loopback_destinations`): a hint either
way, never a denial.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable

from bash_seam import DenialKind, HintSource, SandboxDenial, SandboxHint

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column

# Loopback destinations as tools print them.
_LOOPBACK_HOST = r"(?:127(?:\.\d{1,3}){3}|localhost|\[?::1\]?)"
_DESTINATIONS = (
    # node "connect ECONNREFUSED 127.0.0.1:3000", Go "dial tcp 127.0.0.1:5432", URLs.
    re.compile(rf"(?<![\w.])(?P<host>{_LOOPBACK_HOST}):(?P<port>\d{{1,5}})\b"),
    # curl "Failed to connect to 127.0.0.1 port 8080"
    re.compile(rf"(?<![\w.])(?P<host>{_LOOPBACK_HOST}) port (?P<port>\d{{1,5}})\b"),
    # psql 'connection to server at "127.0.0.1", port 5432 failed'
    re.compile(rf"\"(?P<host>{_LOOPBACK_HOST})\", port (?P<port>\d{{1,5}})\b"),
    # urllib3 "HTTPConnectionPool(host='localhost', port=8000)"
    re.compile(rf"host='(?P<host>{_LOOPBACK_HOST})', port=(?P<port>\d{{1,5}})\b"),
)
_REFUSED = re.compile(r"connection refused|ECONNREFUSED|couldn't connect to server", re.I)

# Names a failed lookup prints.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_NAME = rf"(?P<name>{_LABEL}(?:\.{_LABEL})+)"
_LOOKUPS = (
    re.compile(rf"Could not resolve host: {_NAME}"),  # curl, git
    re.compile(rf"getaddrinfo (?:EAI_AGAIN|ENOTFOUND) {_NAME}"),  # node, npm
    re.compile(rf"\blookup {_NAME}(?::\d+)?(?: on |: )"),  # Go "dial tcp: lookup x on ..."
    re.compile(rf"host='{_NAME}'.*(?:NameResolutionError|Temporary failure in name resolution)"),
    re.compile(rf"unable to resolve host address ['\u2018]{_NAME}['\u2019]"),  # wget
    re.compile(rf"Failed to resolve ['\"]{_NAME}['\"]"),  # pip/urllib3
)
# At most this many names or destinations from one output: a hint, not a log.
_MAX_FOUND = 8


def host_tcp_listeners(proc_net: str = "/proc/net") -> frozenset[tuple[str, int]]:
    """(address, port) of every TCP listener in the calling process's network namespace.

    The executor runs in the host's, so these are the host's listeners. The address is
    ``0.0.0.0``/``::`` for a wildcard listener. Unreadable files give nothing.
    """
    found: set[tuple[str, int]] = set()
    for name, width in (("tcp", 4), ("tcp6", 16)):
        try:
            with open(os.path.join(proc_net, name), encoding="ascii", errors="replace") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _LISTEN or ":" not in fields[1]:
                continue
            hex_address, hex_port = fields[1].rsplit(":", 1)
            try:
                raw = bytes.fromhex(hex_address)
                port = int(hex_port, 16)
            except ValueError:
                continue
            if len(raw) != width:
                continue
            # /proc prints each 32-bit word in host order (little-endian here).
            swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            found.add((str(ipaddress.ip_address(swapped)), port))
    return frozenset(found)


def _host_serves(host: str, port: int, listeners: frozenset[tuple[str, int]]) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for listen_host, listen_port in listeners:
        if listen_port != port:
            continue
        listen = ipaddress.ip_address(listen_host)
        if listen.is_unspecified or listen == address:
            return True
        if isinstance(listen, ipaddress.IPv6Address) and listen.ipv4_mapped == address:
            return True
    return False


def _split(destination: str) -> tuple[str, int] | None:
    host, sep, port = destination.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def loopback_destinations(stdout: str, stderr: str) -> list[str]:
    """``host:port`` of loopback destinations a refused connect in the output names.

    Only lines that also say the connection was refused count; ``localhost`` is named as
    ``127.0.0.1``. At most a few.
    """
    found: dict[str, None] = {}
    for text in (stderr, stdout):
        for line in text.splitlines():
            if not _REFUSED.search(line):
                continue
            for pattern in _DESTINATIONS:
                for m in pattern.finditer(line):
                    host = m.group("host").strip("[]")
                    host = "127.0.0.1" if host == "localhost" else host
                    port = int(m.group("port"))
                    if 0 < port < 65536:
                        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                        found.setdefault(shown, None)
    return list(found)[:_MAX_FOUND]


def loopback_hints(
    destinations: Iterable[str],
    *,
    private_loopback: bool,
    listeners: frozenset[tuple[str, int]] | None = None,
) -> list[SandboxHint]:
    """A hint for each loopback ``host:port`` the command tried that the host serves.

    ``destinations``: the supervisor's record of loopback connects (wanted: see the module
    doc), or `loopback_destinations` of the output. Nothing unless the command has a
    loopback of its own (``private_loopback``); under the host network it reached the
    host's listener itself. ``listeners`` defaults to `host_tcp_listeners()`, read once.
    """
    wanted = {d: s for d in destinations if (s := _split(d)) is not None}
    if not private_loopback or not wanted:
        return []
    if listeners is None:
        listeners = host_tcp_listeners()
    hints: list[SandboxHint] = []
    for destination, (host, port) in wanted.items():
        if _host_serves(host, port, listeners):
            hints.append(
                SandboxHint(
                    kind=DenialKind.NETWORK_CONNECT,
                    target=destination,
                    operation="connect",
                    reason="the host serves it; this sandbox has its own loopback",
                    source=HintSource.HOST_LISTENER,
                )
            )
    return hints


def requested_names(stdout: str, stderr: str) -> list[str]:
    """Host names a failed lookup in the output names (at most a few)."""
    found: dict[str, None] = {}
    for text in (stderr, stdout):
        for pattern in _LOOKUPS:
            for m in pattern.finditer(text):
                found.setdefault(m.group("name").lower().rstrip("."), None)
    return list(found)[:_MAX_FOUND]


def resolve_hints(stdout: str, stderr: str, denials: Iterable[SandboxDenial]) -> list[SandboxHint]:
    """The names the command asked for, when a lookup was witnessed refused.

    The denial (the resolver's address, from the supervisor) is the evidence; the output
    only names what was looked up, so it is a hint beside it, never a denial of its own.
    """
    resolvers = [d.target for d in denials if d.kind is DenialKind.NETWORK_RESOLVE]
    if not resolvers:
        return []
    return [
        SandboxHint(
            kind=DenialKind.NETWORK_RESOLVE,
            target=name,
            operation="resolve",
            reason=f"named by the output; the lookup through {resolvers[0]} was refused",
            source=HintSource.OUTPUT,
        )
        for name in requested_names(stdout, stderr)
    ]
