"""The allowlist parser, matcher, policy validator, network ladder and marker (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies import SandboxPolicy
from policies.egress import (
    EgressRuleError,
    NetworkReach,
    egress_denial_marker,
    is_strictly_wider_network,
    match_egress_rule,
    network_reach,
    parse_allowlist,
    parse_destination,
    parse_egress_rule,
)


@pytest.mark.parametrize(
    ("entry", "canonical", "kind"),
    [
        ("registry.npmjs.org", "registry.npmjs.org", "name"),
        ("Registry.NPMjs.org.", "registry.npmjs.org", "name"),
        ("*.pythonhosted.org", "*.pythonhosted.org", "suffix"),
        ("localhost:8080", "localhost:8080", "name"),
        ("10.0.0.5", "10.0.0.5", "address"),
        ("[::1]:9000", "[::1]:9000", "address"),
        ("::1", "[::1]", "address"),
        ("[0:0:0:0:0:0:0:1]", "[::1]", "address"),
        ("[::ffff:10.0.0.5]:80", "10.0.0.5:80", "address"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example", "name"),
    ],
)
def test_valid_entries_parse_to_their_canonical_text(entry: str, canonical: str, kind: str) -> None:
    rule = parse_egress_rule(entry)
    assert (rule.text, rule.kind) == (canonical, kind)


@pytest.mark.parametrize(
    "entry",
    [
        "",
        " pkg.test",
        "pkg .test",
        "http://pkg.test",
        "pkg.test/simple",
        "user@pkg.test",
        "*",
        "*.org",
        "a.*.org",
        "*pkg.test",
        "pkg.test:0",
        "pkg.test:65536",
        "pkg.test:http",
        "[::1",
        "[::1]x",
        "127.1",
        "0x7f.1",
        "2130706433",
        "bücher.example",
        "a..example",
        "-a.example",
        "a_b.example",
        "0.0.0.0",
        "[::]",
        "224.0.0.1",
        "[fe80::1%eth0]",
        "*.10.0.0.1",
    ],
)
def test_invalid_entries_are_refused_with_an_error_naming_them(entry: str) -> None:
    with pytest.raises(EgressRuleError) as caught:
        parse_egress_rule(entry)
    assert repr(entry) in str(caught.value)
    assert caught.value.code == "EGRESS_RULE_INVALID"


def test_policy_validates_and_canonicalizes_allow_domains(tmp_path: object) -> None:
    policy = SandboxPolicy(
        mode="read-only",
        workspace_root="/",
        allow_domains=("PKG.test", "pkg.test", "[::1]:9000", "*.pythonhosted.org"),
    )
    assert policy.allow_domains == ("pkg.test", "[::1]:9000", "*.pythonhosted.org")
    with pytest.raises(ValidationError) as caught:
        SandboxPolicy(mode="read-only", workspace_root="/", allow_domains=("ok.test", "bad/x"))
    assert "'bad/x'" in str(caught.value)


def _allowed(entries: tuple[str, ...], host: str, port: int) -> bool:
    return match_egress_rule(parse_allowlist(entries), parse_destination(host), port) is not None


@pytest.mark.parametrize(
    ("entries", "host", "port", "allowed"),
    [
        (("registry.npmjs.org",), "registry.npmjs.org", 443, True),
        (("registry.npmjs.org",), "REGISTRY.npmjs.org.", 80, True),
        (("registry.npmjs.org",), "x.registry.npmjs.org", 443, False),
        (("registry.npmjs.org",), "registry.npmjs.org.evil.test", 443, False),
        (("*.pythonhosted.org",), "files.pythonhosted.org", 443, True),
        (("*.pythonhosted.org",), "a.b.pythonhosted.org", 443, True),
        (("*.pythonhosted.org",), "pythonhosted.org", 443, False),
        (("*.pythonhosted.org",), "evilpythonhosted.org", 443, False),
        (("localhost:8080",), "localhost", 8080, True),
        (("localhost:8080",), "localhost", 8081, False),
        (("10.0.0.5",), "10.0.0.5", 22, True),
        (("10.0.0.5",), "[::ffff:10.0.0.5]", 22, True),
        (("10.0.0.5",), "10.0.0.6", 22, False),
        (("[::1]:9000",), "[::1]", 9000, True),
        (("[::1]:9000",), "[0::1]", 9000, True),
        (("[::1]:9000",), "[::1]", 9001, False),
        # A name rule never matches an address, and an address rule never a name.
        (("localhost",), "127.0.0.1", 80, False),
        (("127.0.0.1",), "localhost", 80, False),
    ],
)
def test_destinations_match_only_the_rules_that_name_them(
    entries: tuple[str, ...], host: str, port: int, allowed: bool
) -> None:
    assert _allowed(entries, host, port) is allowed


@pytest.mark.parametrize("host", ["127.1", "0x7f000001", "2130706433", "a b", "", "x" * 300])
def test_numeric_looking_and_malformed_hosts_are_not_destinations(host: str) -> None:
    with pytest.raises(ValueError):
        parse_destination(host)


def test_network_reach_is_a_ladder() -> None:
    assert network_reach("isolated") is NetworkReach.ISOLATED
    assert network_reach("isolated", ("pkg.test",)) is NetworkReach.ALLOWLIST
    assert network_reach("host", ("pkg.test",)) is NetworkReach.HOST


@pytest.mark.parametrize(
    ("target", "target_allow", "current", "current_allow", "wider"),
    [
        ("isolated", ("pkg.test",), "isolated", (), True),
        ("host", (), "isolated", ("pkg.test",), True),
        ("host", (), "isolated", (), True),
        ("isolated", (), "isolated", ("pkg.test",), False),
        ("isolated", (), "host", (), False),
        ("isolated", ("pkg.test",), "host", (), False),
        ("host", (), "host", (), False),
        ("isolated", (), "isolated", (), False),
        # Between allowlists: a strict superset (by coverage) is wider; a reorder is not.
        ("isolated", ("a.test", "b.test"), "isolated", ("a.test",), True),
        ("isolated", ("b.test", "a.test"), "isolated", ("a.test", "b.test"), False),
        ("isolated", ("a.test",), "isolated", ("a.test", "b.test"), False),
        ("isolated", ("b.test",), "isolated", ("a.test",), False),
        ("isolated", ("*.pkg.test",), "isolated", ("files.pkg.test",), True),
        ("isolated", ("files.pkg.test",), "isolated", ("*.pkg.test",), False),
        ("isolated", ("pkg.test",), "isolated", ("pkg.test:443",), True),
        ("isolated", ("pkg.test:443",), "isolated", ("pkg.test",), False),
    ],
)
def test_is_strictly_wider_network(
    target: str,
    target_allow: tuple[str, ...],
    current: str,
    current_allow: tuple[str, ...],
    wider: bool,
) -> None:
    assert (
        is_strictly_wider_network(
            target, current, target_allow=target_allow, current_allow=current_allow
        )
        is wider
    )


def test_denial_marker_text() -> None:
    assert egress_denial_marker("evil.example:443", "not on the allowlist") == (
        "[sandbox: network connect to evil.example:443 denied (not on the allowlist) under "
        "isolated network; add it to allow_domains or ask for network=host]"
    )
