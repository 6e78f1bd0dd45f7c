"""The egress allowlist: its entries, how a destination matches them, and the network ladder.

Pure: no sockets, no name resolution. The proxy in `bash_sandbox.egress` enforces what is
decided here.

Entries of `allow_domains` (case-insensitive; a trailing dot is dropped):

- ``registry.npmjs.org``: exactly that host name, any port;
- ``*.pythonhosted.org``: every name *below* the suffix (``files.pythonhosted.org``,
  ``a.b.pythonhosted.org``), not the suffix itself; the suffix needs two labels or more;
- ``10.0.0.5``, ``[::1]`` (or bare ``::1``): exactly that address, never a name resolving to it;
- any of these with ``:port`` (``localhost:8080``, ``[::1]:9000``): that port only.

A host name never matches an address rule and an address never matches a name rule, so an
IP literal reaches only what the list names literally. Names are ASCII (write IDNs in their
``xn--`` form); a name whose last label is all digits or hex-looking is refused, because
resolvers read ``127.1`` or ``0x7f.1`` as addresses.

The network ladder, narrowest first: ``isolated`` (own loopback only) < ``allowlist``
(``isolated`` plus a non-empty `allow_domains`, served by the proxy) < ``host``. Between two
allowlists, the one whose rules cover all of the other's and more is the wider.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from policies.errors import PolicyError
from policies.modes import NetworkMode

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# The last label of a host name: what `inet_aton` would read as a number is not a name.
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
_MAX_NAME = 253

RuleKind = Literal["name", "suffix", "address"]


class EgressRuleError(PolicyError):
    """An `allow_domains` entry is not a destination this proxy can match."""

    code = "EGRESS_RULE_INVALID"


class EgressRule(BaseModel):
    """One parsed `allow_domains` entry. ``host`` is canonical: a lowercase name, the
    suffix of a wildcard without ``*.``, or an address's compressed text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: RuleKind
    host: str
    port: int | None = None

    @property
    def text(self) -> str:
        """The entry in canonical form (what the validated policy stores)."""
        if self.kind == "suffix":
            host = f"*.{self.host}"
        elif self.kind == "address" and ":" in self.host:
            host = f"[{self.host}]"  # bracketed with or without a port: one spelling
        else:
            host = self.host
        return host if self.port is None else f"{host}:{self.port}"

    @property
    def names_localhost(self) -> bool:
        """The rule names `localhost` (or a name under it): loopback is what it asks for."""
        return self.kind != "address" and (
            self.host == "localhost" or self.host.endswith(".localhost")
        )

    def matches(self, host: Destination, port: int) -> bool:
        """The rule allows ``host:port``: names match names, addresses match addresses."""
        if self.port is not None and self.port != port:
            return False
        if host.address is not None:
            return self.kind == "address" and self.host == str(host.address)
        if self.kind == "name":
            return host.name == self.host
        if self.kind == "suffix":
            return host.name.endswith("." + self.host)
        return False

    def covers(self, other: EgressRule) -> bool:
        """Every destination ``other`` allows, this rule allows too."""
        if self.port is not None and self.port != other.port:
            return False
        if self.kind == "address" or other.kind == "address":
            return self.kind == other.kind and self.host == other.host
        if self.kind == "name":
            return other.kind == "name" and other.host == self.host
        # A suffix covers the names and suffixes below it, and itself; never its apex name.
        below = other.host.endswith("." + self.host)
        return below or (other.kind == "suffix" and other.host == self.host)


class Destination(BaseModel):
    """A requested host, canonical: a lowercase name, or an address (IPv4-mapped unwrapped)."""

    model_config = ConfigDict(frozen=True)

    name: str
    address: IPAddress | None = None

    @property
    def is_localhost(self) -> bool:
        return self.address is None and (
            self.name == "localhost" or self.name.endswith(".localhost")
        )


def _check_name(name: str) -> str | None:
    """Why ``name`` (lowercase, no trailing dot) is not a host name, or None."""
    if not name or len(name) > _MAX_NAME:
        return "a host name is 1 to 253 characters"
    labels = name.split(".")
    for label in labels:
        if not _LABEL.match(label):
            return f"label {label!r} is not letters, digits and inner hyphens (1-63 characters)"
    if _NUMERIC_LABEL.match(labels[-1]):
        return "it reads as a numeric address, not a name; write the address itself"
    return None


def _unwrap_mapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_destination(host: str) -> Destination:
    """A requested host (``example.org``, ``10.0.0.5``, ``[::1]`` or ``::1``), canonical.

    Raises `ValueError` saying why it is not a host. An IPv4-mapped IPv6 address is read as
    the IPv4 address it carries, so a rule naming ``10.0.0.5`` also covers ``[::ffff:10.0.0.5]``.
    """
    if not host or host != host.strip():
        raise ValueError(f"{host!r}: empty or padded with whitespace")
    text = host.lower()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1]
        if "%" in inner:
            raise ValueError(f"{host!r}: scoped IPv6 addresses are not destinations")
        try:
            unwrapped = _unwrap_mapped(ipaddress.IPv6Address(inner))
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address in brackets") from None
        return Destination(name=str(unwrapped), address=unwrapped)
    if "%" in text:
        raise ValueError(f"{host!r}: scoped IPv6 addresses are not destinations")
    try:
        address = _unwrap_mapped(ipaddress.ip_address(text))
    except ValueError:
        pass
    else:
        return Destination(name=str(address), address=address)
    if text.endswith("."):
        text = text[:-1]  # the root label: `example.org.` is `example.org`
    if not text.isascii():
        raise ValueError(f"{host!r}: write international names in their ASCII (xn--) form")
    reason = _check_name(text)
    if reason is not None:
        raise ValueError(f"{host!r} is not a host name: {reason}")
    return Destination(name=text)


def split_host_port(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` / ``[v6][:port]`` split; a bare IPv6 address has no port.

    Raises `ValueError` for an empty host or a port outside 1-65535.
    """
    port_text: str | None = None
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise ValueError(f"{authority!r}: unclosed '['")
        host, rest = authority[: close + 1], authority[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{authority!r}: expected ':port' after ']'")
            port_text = rest[1:]
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    else:
        host = authority  # no port, or a bare IPv6 address
    if not host:
        raise ValueError(f"{authority!r}: empty host")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{authority!r}: port must be a number from 1 to 65535")
    return host, int(port_text)


def parse_egress_rule(entry: str) -> EgressRule:
    """One `allow_domains` entry, parsed. Raises `EgressRuleError` naming the entry."""

    def bad(reason: str) -> EgressRuleError:
        return EgressRuleError(
            f"allow_domains entry {entry!r} is invalid: {reason}",
            hint="use a name (registry.npmjs.org), *.suffix, an address (10.0.0.5, [::1]), "
            "each with an optional :port",
        )

    if not isinstance(entry, str):
        raise bad("not a string")
    if entry != entry.strip() or not entry or any(c.isspace() for c in entry):
        raise bad("empty or contains whitespace")
    if "/" in entry or "@" in entry or "://" in entry:
        raise bad("write a host, not a URL (no scheme, path or user)")
    try:
        host, port = split_host_port(entry)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if host == "*":
        raise bad("'*' allows everything; ask for network=host instead")
    if host.startswith("*."):
        try:
            suffix = parse_destination(host[2:])
        except ValueError as exc:
            raise bad(str(exc)) from None
        if suffix.address is not None:
            raise bad("a wildcard needs a name suffix, not an address")
        if "." not in suffix.name:
            raise bad("a wildcard over a single label is too broad; name a longer suffix")
        return EgressRule(kind="suffix", host=suffix.name, port=port)
    if "*" in host:
        raise bad("'*' may only start an entry, as in *.example.org")
    try:
        destination = parse_destination(host)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if destination.address is not None:
        if destination.address.is_unspecified or destination.address.is_multicast:
            raise bad("an unspecified or multicast address is not a destination")
        return EgressRule(kind="address", host=str(destination.address), port=port)
    return EgressRule(kind="name", host=destination.name, port=port)


def parse_allowlist(entries: Iterable[str]) -> tuple[EgressRule, ...]:
    """Every entry parsed, in order, duplicates dropped. Raises `EgressRuleError`."""
    seen: dict[EgressRule, None] = {}
    for entry in entries:
        seen.setdefault(parse_egress_rule(entry), None)
    return tuple(seen)


def canonical_allowlist(entries: Iterable[str]) -> tuple[str, ...]:
    """The entries in canonical text, in order, duplicates dropped (the policy's validator)."""
    return tuple(rule.text for rule in parse_allowlist(entries))


def parse_private_domain(entry: str) -> EgressRule:
    """One `allow_private_domains` entry: a name or ``*.suffix`` (no port, no address), whose
    DNS answers may be private. Raises `EgressRuleError` naming the entry."""
    rule = parse_egress_rule(entry)
    if rule.kind == "address" or rule.port is not None:
        raise EgressRuleError(
            f"allow_private_domains entry {entry!r} is invalid: name a host or *.suffix "
            "without a port (an address is reached by naming it in allow_domains)",
            hint="e.g. allow_private_domains = ['pypi.corp.example', '*.internal.example']",
        )
    return rule


def canonical_private_domains(entries: Iterable[str]) -> tuple[str, ...]:
    """`allow_private_domains` in canonical text, in order, duplicates dropped."""
    return tuple(rule.text for rule in parse_private_domains(entries))


def parse_private_domains(entries: Iterable[str]) -> tuple[EgressRule, ...]:
    """Every `allow_private_domains` entry parsed, duplicates dropped."""
    return tuple(dict.fromkeys(parse_private_domain(e) for e in entries))


def canonical_pins(pins: Mapping[str, str | Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The operator's ``pin = {name = address}`` table, canonical: lowercase names, each
    with its addresses (one, or a list) in compressed text. Raises `EgressRuleError`."""

    def bad(name: str, reason: str) -> EgressRuleError:
        return EgressRuleError(
            f"pin entry {name!r} is invalid: {reason}",
            hint='write pin = {"registry.example" = "10.0.0.5"} (or a list of addresses)',
        )

    out: dict[str, tuple[str, ...]] = {}
    for name, value in pins.items():
        try:
            destination = parse_destination(name)
        except ValueError as exc:
            raise bad(name, str(exc)) from None
        if destination.address is not None:
            raise bad(name, "pin a host name, not an address")
        values = [value] if isinstance(value, str) else list(value)
        if not values:
            raise bad(name, "no address")
        addresses: list[str] = []
        for text in values:
            try:
                address = _unwrap_mapped(ipaddress.ip_address(text))
            except ValueError:
                raise bad(name, f"{text!r} is not an IP address") from None
            if address.is_unspecified or address.is_multicast:
                raise bad(name, f"{text} is an unspecified or multicast address")
            addresses.append(str(address))
        out[destination.name] = tuple(dict.fromkeys(addresses))
    return out


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EgressCredential(BaseModel):
    """One secret the egress proxy injects and the sandbox never holds (`credentials`).

    The command sees a placeholder where it expects the secret: in the variable ``env``, and
    (with ``username``) in the answer of a git credential helper for ``https://domain``. The
    proxy terminates TLS for ``domain`` only and replaces the placeholder with the secret in
    the request headers (``Authorization: Bearer ...``, or inside ``Basic`` credentials);
    a placeholder sent anywhere else is refused. ``source`` is where the executor reads the
    secret: ``env:NAME`` (its own environment) or ``file:/absolute/path``.
    ``upstream_ca_file``: the CA bundle to verify ``domain``'s server with (default: the
    system's roots).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: str
    source: str
    env: str | None = None
    username: str | None = None
    upstream_ca_file: str | None = None

    @field_validator("domain")
    @classmethod
    def _a_name(cls, value: str) -> str:
        destination = parse_destination(value)
        if destination.address is not None:
            raise ValueError("a credential's domain is a host name, not an address")
        return destination.name

    @field_validator("source")
    @classmethod
    def _a_source(cls, value: str) -> str:
        kind, _, rest = value.partition(":")
        if kind == "env" and _ENV_NAME.match(rest):
            return value
        if kind == "file" and rest.startswith("/"):
            return value
        raise ValueError("source is env:NAME or file:/absolute/path")

    @field_validator("env")
    @classmethod
    def _an_env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @field_validator("username")
    @classmethod
    def _a_username(cls, value: str | None) -> str | None:
        # It is written into a git credential helper's shell line: a plain user name only.
        if value is not None and not re.fullmatch(r"[A-Za-z0-9._@+-]{1,128}", value):
            raise ValueError("username: letters, digits and . _ @ + - only")
        return value


def match_egress_rule(
    rules: Sequence[EgressRule], host: Destination, port: int
) -> EgressRule | None:
    """The first rule allowing ``host:port``, or None."""
    for rule in rules:
        if rule.matches(host, port):
            return rule
    return None


class NetworkReach(enum.StrEnum):
    """How far a confined command's network reaches, narrowest first."""

    ISOLATED = "isolated"
    ALLOWLIST = "allowlist"
    HOST = "host"


_REACH_ORDER = (NetworkReach.ISOLATED, NetworkReach.ALLOWLIST, NetworkReach.HOST)


def network_reach(network: NetworkMode | str, allow_domains: Sequence[str] = ()) -> NetworkReach:
    """``isolated`` with a non-empty allowlist is ``allowlist``; ``host`` is always ``host``."""
    if NetworkMode(network) is NetworkMode.HOST:
        return NetworkReach.HOST
    return NetworkReach.ALLOWLIST if allow_domains else NetworkReach.ISOLATED


def is_strictly_wider_network(
    target: NetworkMode | str,
    current: NetworkMode | str,
    *,
    target_allow: Sequence[str] = (),
    current_allow: Sequence[str] = (),
) -> bool:
    """True when (``target``, ``target_allow``) reaches more than (``current``, ``current_allow``).

    Up the ladder is wider. Between two allowlists, the target is wider when its rules cover
    every current rule and at least one of its rules is not covered by the current ones (a
    per-call addition); a mere reordering or a narrower list is not an escalation.
    """
    target_reach = network_reach(target, target_allow)
    current_reach = network_reach(current, current_allow)
    if target_reach is not current_reach:
        return _REACH_ORDER.index(target_reach) > _REACH_ORDER.index(current_reach)
    if target_reach is not NetworkReach.ALLOWLIST:
        return False
    wider, narrower = parse_allowlist(target_allow), parse_allowlist(current_allow)
    covers_current = all(any(t.covers(c) for t in wider) for c in narrower)
    adds = any(not any(c.covers(t) for c in narrower) for t in wider)
    return covers_current and adds


def egress_step(reason: str) -> str:
    """The next step for a proxy refusal whose short ``reason`` is given: the key that
    would allow it."""
    if "allow_private_domains" in reason:
        return "add the name to allow_private_domains or pin its address (pin, /etc/hosts)"
    if "only a pin" in reason:
        return "only the operator's pin (pin, /etc/hosts) allows that address"
    return "add it to allow_domains or ask for network=host"


def egress_denial_marker(destination: str, reason: str) -> str:
    """The line a harness shows (and matches) when the proxy refused ``destination``.

    ``destination`` is ``host:port``; ``reason`` a short phrase such as "not on the allowlist".
    """
    return (
        f"[sandbox: network connect to {destination} denied ({reason}) under isolated network; "
        f"{egress_step(reason)}]"
    )
