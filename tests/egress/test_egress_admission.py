"""`admit()`: the allowlist, the resolver and the address rules together (no sockets)."""

from __future__ import annotations

import ipaddress

import pytest

from bash_sandbox.egress import EgressDenialCode, Resolution, StaticResolver
from bash_sandbox.egress.admission import EgressRefused, admit
from policies.egress import parse_allowlist


class CountingResolver:
    """Answers like DNS would (unpinned) and counts the lookups."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(self, name: str) -> Resolution:
        self.asked.append(name)
        return Resolution(tuple(ipaddress.ip_address(a) for a in self.answers[name]))


async def test_a_name_off_the_list_is_refused_before_any_lookup() -> None:
    resolver = CountingResolver({"evil.test": ["8.8.8.8"]})
    with pytest.raises(EgressRefused) as caught:
        await admit(parse_allowlist(["pkg.test"]), "evil.test", 443, resolver)
    assert caught.value.denial.code is EgressDenialCode.NOT_ALLOWED
    assert caught.value.denial.destination == "evil.test:443"
    assert resolver.asked == []


async def test_an_allowed_name_gets_exactly_the_resolved_public_addresses() -> None:
    resolver = CountingResolver({"pkg.test": ["8.8.8.8", "2606:4700::1111"]})
    admission = await admit(parse_allowlist(["pkg.test"]), "PKG.test.", 443, resolver)
    assert [str(a) for a in admission.addresses] == ["8.8.8.8", "2606:4700::1111"]
    assert resolver.asked == ["pkg.test"]


@pytest.mark.parametrize(
    "answer",
    [["127.0.0.1"], ["10.0.0.7"], ["8.8.8.8", "169.254.169.254"], ["::ffff:192.168.0.1"]],
)
async def test_a_name_resolving_to_any_non_public_address_is_refused(answer: list[str]) -> None:
    resolver = CountingResolver({"pkg.test": answer})
    with pytest.raises(EgressRefused) as caught:
        await admit(parse_allowlist(["pkg.test"]), "pkg.test", 443, resolver)
    denial = caught.value.denial
    assert denial.code is EgressDenialCode.FORBIDDEN_ADDRESS
    assert denial.reason.startswith("resolves to ")
    assert "only an allow_domains entry naming that address" in denial.message()


async def test_an_operator_pinned_answer_is_trusted() -> None:
    resolver = StaticResolver({"pkg.test": "10.0.0.7"})
    admission = await admit(parse_allowlist(["pkg.test"]), "pkg.test", 443, resolver)
    assert [str(a) for a in admission.addresses] == ["10.0.0.7"]


async def test_an_ip_literal_needs_a_rule_naming_it_and_is_then_its_own_answer() -> None:
    resolver = CountingResolver({})
    with pytest.raises(EgressRefused) as caught:
        await admit(parse_allowlist(["pkg.test"]), "10.0.0.5", 22, resolver)
    assert caught.value.denial.code is EgressDenialCode.ADDRESS_NOT_ALLOWED
    admission = await admit(parse_allowlist(["10.0.0.5:22"]), "10.0.0.5", 22, resolver)
    assert [str(a) for a in admission.addresses] == ["10.0.0.5"]
    assert resolver.asked == []


async def test_localhost_is_loopback_without_a_lookup() -> None:
    resolver = CountingResolver({"localhost": ["10.9.9.9"]})
    admission = await admit(parse_allowlist(["localhost:8080"]), "localhost", 8080, resolver)
    assert [str(a) for a in admission.addresses] == ["127.0.0.1", "::1"]
    assert resolver.asked == []


async def test_a_hostile_host_is_refused_and_reported_printably() -> None:
    with pytest.raises(EgressRefused) as caught:
        await admit(parse_allowlist(["pkg.test"]), "a\x1b]0;pwn\x07.test", 80, CountingResolver({}))
    denial = caught.value.denial
    assert denial.code is EgressDenialCode.INVALID_HOST
    assert all(" " <= c < "\x7f" for c in denial.message())
