"""`admit()`: the allowlist, the resolver and the address rules together (no sockets)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from bash_sandbox.egress import EgressDenialCode, Resolution, ResolutionError, StaticResolver
from bash_sandbox.egress.admission import EgressRefused, admit
from bash_sandbox.egress.resolver import PinnedResolver
from policies.egress import parse_allowlist, parse_private_domains


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
    ("answer", "code", "key"),
    [
        (["127.0.0.1"], EgressDenialCode.FORBIDDEN_ADDRESS, "pin = {pkg.test = address}"),
        (["10.0.0.7"], EgressDenialCode.PRIVATE_ADDRESS, "allow_private_domains"),
        (["8.8.8.8", "169.254.169.254"], EgressDenialCode.FORBIDDEN_ADDRESS, "/etc/hosts"),
        (["::ffff:192.168.0.1"], EgressDenialCode.PRIVATE_ADDRESS, "--allow-private-domain"),
    ],
)
async def test_a_name_resolving_to_any_non_public_address_is_refused(
    answer: list[str], code: EgressDenialCode, key: str
) -> None:
    resolver = CountingResolver({"pkg.test": answer})
    with pytest.raises(EgressRefused) as caught:
        await admit(parse_allowlist(["pkg.test"]), "pkg.test", 443, resolver)
    denial = caught.value.denial
    assert denial.code is code
    assert denial.reason.startswith("resolves to ") and "by DNS" in denial.reason
    assert key in denial.message()


@pytest.mark.parametrize("answer", ["10.0.0.7", "fd00::5", "100.64.1.1", "192.168.3.4"])
async def test_a_private_dns_answer_is_used_for_a_name_in_allow_private_domains(
    answer: str,
) -> None:
    resolver = CountingResolver({"mirror.corp.test": [answer]})
    rules = parse_allowlist(["mirror.corp.test", "other.test"])
    private = parse_private_domains(["*.corp.test"])
    admission = await admit(rules, "mirror.corp.test", 443, resolver, private=private)
    assert [str(a) for a in admission.addresses] == [answer]
    assert admission.pinned_by is None
    # Another allowed name is not covered by the private list.
    resolver.answers["other.test"] = [answer]
    with pytest.raises(EgressRefused) as caught:
        await admit(rules, "other.test", 443, resolver, private=private)
    assert caught.value.denial.code is EgressDenialCode.PRIVATE_ADDRESS


@pytest.mark.parametrize(
    "answer", ["127.0.0.1", "::1", "169.254.169.254", "fd00:ec2::254", "169.254.7.7", "0.0.0.0"]
)
async def test_allow_private_domains_never_opens_loopback_link_local_or_metadata(
    answer: str,
) -> None:
    resolver = CountingResolver({"mirror.corp.test": [answer]})
    rules = parse_allowlist(["mirror.corp.test"])
    private = parse_private_domains(["mirror.corp.test"])
    with pytest.raises(EgressRefused) as caught:
        await admit(rules, "mirror.corp.test", 443, resolver, private=private)
    assert caught.value.denial.code is EgressDenialCode.FORBIDDEN_ADDRESS
    assert "only a pin" in caught.value.denial.reason


async def test_a_pinned_loopback_or_metadata_address_is_used_and_named(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# test\n127.0.0.1 registry.test\n0.0.0.0 blocked.test\n")
    resolver = PinnedResolver(
        {"metadata.test": ("169.254.169.254",)},
        hosts_file=str(hosts),
        fallback=CountingResolver({"registry.test": ["8.8.8.8"], "blocked.test": ["8.8.8.8"]}),
    )
    rules = parse_allowlist(["registry.test", "metadata.test", "blocked.test"])
    by_hosts = await admit(rules, "registry.test", 80, resolver)
    assert [str(a) for a in by_hosts.addresses] == ["127.0.0.1"]
    assert by_hosts.pinned_by == str(hosts)
    by_pin = await admit(rules, "metadata.test", 80, resolver)
    assert [str(a) for a in by_pin.addresses] == ["169.254.169.254"]
    assert by_pin.pinned_by == "pin"
    # A hosts-file block (0.0.0.0) is never looked up elsewhere, nor connected to.
    with pytest.raises(ResolutionError, match="blocked"):
        await admit(rules, "blocked.test", 80, resolver)
    # The file is read again when it changes.
    hosts.write_text("127.0.0.2 registry.test\n")
    again = await admit(rules, "registry.test", 80, resolver)
    assert [str(a) for a in again.addresses] == ["127.0.0.2"]


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
