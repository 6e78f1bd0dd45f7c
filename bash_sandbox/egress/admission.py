"""Whether the egress proxy may reach one ``host:port``, and at which addresses.

The order matters:

1. The host is parsed (`parse_destination`): a malformed or numeric-looking name is refused
   before anything else looks at it.
2. The allowlist decides on the host *as written*: a name matches name and suffix rules, an
   IP literal matches only a rule naming that address.
3. Names are resolved by the proxy's own resolver (``localhost`` is loopback by definition,
   never looked up). An address rule is its own answer.
4. An answer the operator pinned (the `pin` table, the hosts file) is used whatever its
   range. A DNS answer must be public unicast (`forbidden_address_reason`), except a private
   one (RFC 1918, ULA, CGNAT, ...) for a name in `allow_private_domains`; loopback,
   link-local and cloud-metadata answers only ever by a pin (`needs_pin`), or loopback by a
   rule naming ``localhost``. So is an address of this host itself (`is_own_address`: its
   LAN or public address, where services bound to every interface answer as on loopback).
   One refused answer refuses the whole name: a mixed answer is how rebinding attacks look.

The proxy then connects to exactly these addresses and nothing else.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from bash_sandbox.egress.addresses import forbidden_address_reason, is_own_address, needs_pin
from bash_sandbox.egress.resolver import IPAddress, Resolver
from bash_seam import DenialEvidence, DenialKind, SandboxDenial
from policies.egress import (
    Destination,
    EgressRule,
    egress_denial_marker,
    match_egress_rule,
    parse_destination,
)

_LOOPBACK: tuple[IPAddress, ...] = (
    ipaddress.IPv4Address("127.0.0.1"),
    ipaddress.IPv6Address("::1"),
)


class EgressDenialCode(enum.StrEnum):
    """Why the proxy refused a destination."""

    NOT_ALLOWED = "not-allowed"  # a name no rule matches
    ADDRESS_NOT_ALLOWED = "address-not-allowed"  # an IP literal no rule names
    # An allowed name whose DNS answer is loopback, link-local or metadata: only a pin allows it.
    FORBIDDEN_ADDRESS = "forbidden-address"
    # An allowed name whose DNS answer is private: allow_private_domains allows it.
    PRIVATE_ADDRESS = "private-address"
    INVALID_HOST = "invalid-host"  # not a host name or address at all
    # A credential's placeholder sent where that credential does not belong.
    CREDENTIAL_ELSEWHERE = "credential-elsewhere"
    # A request in a credential domain's tunnel addressed past the domain (another Host, an
    # absolute target, CONNECT, TRACE): its injected secret could reach someone else.
    CREDENTIAL_MISDIRECTED = "credential-misdirected"


def printable(text: str, limit: int = 120) -> str:
    """``text`` safe for a status line, a log and a terminal: printable ASCII, bounded."""
    safe = "".join(c if " " <= c < "\x7f" else "?" for c in text)
    return safe if len(safe) <= limit else safe[: limit - 3] + "..."


class EgressDenial(BaseModel):
    """One destination the proxy refused: what was asked for, and why."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int
    code: EgressDenialCode
    reason: str  # a short phrase: "not on the allowlist", "resolves to 10.0.0.1 (private)"

    @property
    def destination(self) -> str:
        """``host:port``, IPv6 in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def message(self) -> str:
        """The one line the client gets in its 403 (status line and body)."""
        where = self.destination
        if self.code is EgressDenialCode.NOT_ALLOWED:
            return f"bash-sandbox: {where} is not on the allowlist (allow_domains)"
        if self.code is EgressDenialCode.ADDRESS_NOT_ALLOWED:
            return (
                f"bash-sandbox: {where} is an IP address not on the allowlist "
                "(allow_domains must name the address itself)"
            )
        if self.code is EgressDenialCode.PRIVATE_ADDRESS:
            return (
                f"bash-sandbox: {where} {self.reason} (private-address rule: add {self.host} "
                "to allow_private_domains / --allow-private-domain, or pin its address)"
            )
        if self.code is EgressDenialCode.FORBIDDEN_ADDRESS:
            return (
                f"bash-sandbox: {where} {self.reason} (loopback/metadata rule: "
                f"pin = {{{self.host} = address}} or an /etc/hosts line)"
            )
        if self.code is EgressDenialCode.CREDENTIAL_MISDIRECTED:
            return (
                f"bash-sandbox: the request to {where} {self.reason}; a credential is injected "
                "only into requests for its own domain's paths (credentials)"
            )
        if self.code is EgressDenialCode.CREDENTIAL_ELSEWHERE:
            return (
                f"bash-sandbox: the request to {where} {self.reason}; a credential is injected "
                "only over https to its own domain (credentials)"
            )
        return f"bash-sandbox: {where} is refused: {self.reason}"

    def marker(self) -> str:
        """The harness's marker line for this denial."""
        return egress_denial_marker(self.destination, self.reason)

    def to_sandbox_denial(self) -> SandboxDenial:
        """The denial in the seam's vocabulary, for `SandboxFacts.denials`."""
        return SandboxDenial(
            kind=DenialKind.NETWORK_CONNECT,
            target=self.destination,
            operation="connect",
            reason=self.reason,
            evidence=DenialEvidence.PROXY,
        )


class EgressRefused(Exception):
    """The destination is refused; ``denial`` says what and why."""

    def __init__(self, denial: EgressDenial) -> None:
        super().__init__(denial.message())
        self.denial = denial


@dataclass(frozen=True)
class Admission:
    """An allowed destination and the only addresses the proxy may connect to."""

    destination: Destination
    port: int
    rule: EgressRule
    addresses: tuple[IPAddress, ...]
    pinned_by: str | None = None  # the operator's pin that gave the addresses ("pin", a path)


async def admit(
    rules: Sequence[EgressRule],
    host: str,
    port: int,
    resolver: Resolver,
    *,
    private: Sequence[EgressRule] = (),
) -> Admission:
    """The addresses to connect to for ``host:port``, or `EgressRefused`. ``private``:
    the parsed `allow_private_domains`.

    Resolution failures raise `ResolutionError` (not a policy refusal: the name is allowed).
    """
    try:
        destination = parse_destination(host)
    except ValueError as exc:
        raise EgressRefused(
            EgressDenial(
                host=printable(host, 80),
                port=port,
                code=EgressDenialCode.INVALID_HOST,
                reason=f"not a valid host ({printable(str(exc))})",
            )
        ) from None
    rule = match_egress_rule(rules, destination, port)
    if rule is None:
        literal = destination.address is not None
        raise EgressRefused(
            EgressDenial(
                host=destination.name,
                port=port,
                code=(
                    EgressDenialCode.ADDRESS_NOT_ALLOWED
                    if literal
                    else EgressDenialCode.NOT_ALLOWED
                ),
                reason="IP address not on the allowlist" if literal else "not on the allowlist",
            )
        )
    if destination.address is not None:
        # The rule names this very address: the operator asked for it, private or not.
        return Admission(destination, port, rule, (destination.address,))
    if destination.is_localhost:
        addresses, pinned, source = _LOOPBACK, False, None
    else:
        resolution = await resolver.resolve(destination.name)
        addresses, pinned, source = resolution.addresses, resolution.pinned, resolution.source
    if pinned:
        return Admission(destination, port, rule, addresses, pinned_by=source or "pin")
    private_ok = match_egress_rule(private, destination, port) is not None
    for address in addresses:
        why = forbidden_address_reason(address, loopback_named=rule.names_localhost)
        pin_only = needs_pin(address)
        if not pin_only and is_own_address(address):
            why, pin_only = "an address of this host", True
        if why is None:
            continue
        if pin_only:
            code, reason = EgressDenialCode.FORBIDDEN_ADDRESS, "only a pin allows it"
        elif private_ok:
            continue
        else:
            code, reason = EgressDenialCode.PRIVATE_ADDRESS, "not in allow_private_domains"
        raise EgressRefused(
            EgressDenial(
                host=destination.name,
                port=port,
                code=code,
                reason=f"resolves to {address} ({why}) by DNS, {reason}",
            )
        )
    return Admission(destination, port, rule, addresses)
