"""Flags keep the contract's meaning; the bounded list; one marker line per denial."""

from __future__ import annotations

import os

import pytest

from bash_sandbox.facts import DENIALS_LIMIT, bounded_denials, denial_marker, derive_facts_flags
from bash_seam import DenialEvidence, DenialKind, SandboxDenial
from policies import sandbox_denial_marker


def _denial(
    kind: DenialKind,
    target: str,
    reason: str = "outside the writable roots",
    evidence: DenialEvidence = DenialEvidence.INFERRED,
    operation: str | None = None,
) -> SandboxDenial:
    return SandboxDenial(
        kind=kind, target=target, reason=reason, evidence=evidence, operation=operation
    )


WRITE = _denial(DenialKind.FILE_WRITE, "/srv/out")
CONNECT = _denial(
    DenialKind.NETWORK_CONNECT, "93.184.216.34:443", "", DenialEvidence.SUPERVISOR, "connect"
)


@pytest.mark.parametrize(
    ("exit_code", "signal", "folds", "expected"),
    [
        (1, None, False, (True, True)),
        (0, None, False, (False, False)),  # a successful run is never denied
        (None, "SIGKILL", False, (False, False)),
        (137, None, True, (False, False)),  # a folded SIGKILL
        (137, None, False, (True, True)),  # a real exit 137 of an unfolding runner
        (2, None, True, (True, True)),
    ],
)
def test_flags_need_a_failed_run_of_its_own(
    exit_code: int | None, signal: str | None, folds: bool, expected: tuple[bool, bool]
) -> None:
    assert derive_facts_flags([WRITE, CONNECT], exit_code, signal, folds_signals=folds) == expected


def test_kinds_map_to_their_flag() -> None:
    def flags(*denials: SandboxDenial) -> tuple[bool, bool]:
        return derive_facts_flags(denials, 1, None, folds_signals=False)

    assert flags() == (False, False)
    assert flags(_denial(DenialKind.FILE_READ, "/h/.ssh", "deny_read")) == (True, False)
    assert flags(_denial(DenialKind.SOCKET, "/run/docker.sock", "host unix socket")) == (
        True,
        False,
    )
    assert flags(_denial(DenialKind.NETWORK_RESOLVE, "example.com", "")) == (False, True)
    assert flags(CONNECT) == (False, True)


def test_bounded_list_keeps_the_first_and_counts_all() -> None:
    many = [_denial(DenialKind.FILE_WRITE, f"/srv/out/{i}") for i in range(40)]
    kept, total = bounded_denials([*many, *many])
    assert len(kept) == DENIALS_LIMIT
    assert [d.target for d in kept] == [f"/srv/out/{i}" for i in range(DENIALS_LIMIT)]
    assert total == 40


def test_a_witnessed_denial_replaces_the_inferred_one_in_place() -> None:
    witnessed = _denial(DenialKind.FILE_WRITE, "/srv/out", evidence=DenialEvidence.KERNEL)
    other = _denial(DenialKind.FILE_WRITE, "/srv/other")
    kept, total = bounded_denials([WRITE, other, witnessed, WRITE])
    assert kept == (witnessed, other)
    assert total == 2


def test_the_overlays_word_wins_for_a_write_it_saw_land_and_discarded() -> None:
    seen = _denial(DenialKind.FILE_WRITE, "/ws/.git/config.worktree", "held read-only",
                   DenialEvidence.SUPERVISOR)  # fmt: skip
    overlay = _denial(DenialKind.FILE_WRITE, "/ws/.git/config.worktree",
                      "git control plane (config.worktree)", DenialEvidence.OVERLAY)  # fmt: skip
    assert bounded_denials([seen, overlay]) == ((overlay,), 1)
    assert bounded_denials([overlay, seen]) == ((overlay,), 1)


def test_markers_name_what_why_and_the_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    assert denial_marker(WRITE, "workspace-write", "isolated") == (
        "[sandbox: write to /srv/out denied (outside the writable roots) under workspace-write "
        "mode (inferred); add it to writable_roots or ask for danger-full-access]"
    )
    assert denial_marker(
        _denial(DenialKind.FILE_WRITE, "/srv/ws/a", "read-only mode", DenialEvidence.SUPERVISOR),
        "read-only",
        "isolated",
    ) == ("[sandbox: write to /srv/ws/a denied under read-only mode; ask for workspace-write]")
    assert denial_marker(
        _denial(DenialKind.FILE_READ, "/home/u/.ssh/id_rsa", "deny_read"), "read-only", None
    ) == (
        "[sandbox: read of ~/.ssh/id_rsa denied (deny_read) under read-only mode (inferred); "
        "remove it from deny_read or ask for danger-full-access]"
    )
    assert denial_marker(
        _denial(
            DenialKind.SOCKET,
            "/run/docker.sock",
            "host unix socket",
            DenialEvidence.SUPERVISOR,
            "connect",
        ),
        "read-only",
        "host",
    ) == (
        "[sandbox: connect to unix socket /run/docker.sock denied (host unix socket) under "
        "read-only mode; add it to allow_unix_sockets]"
    )
    assert denial_marker(CONNECT, "workspace-write", "isolated") == (
        "[sandbox: connect to 93.184.216.34:443 denied under isolated network; "
        "ask for network=host or add the domain to allow_domains]"
    )
    lookup = _denial(DenialKind.NETWORK_RESOLVE, "10.0.0.2:53", "", DenialEvidence.SUPERVISOR)
    assert denial_marker(lookup, "read-only", "isolated").startswith(
        "[sandbox: name lookup through the resolver 10.0.0.2:53 denied under isolated network; "
    )
    proxied = _denial(
        DenialKind.NETWORK_CONNECT, "evil.example:443", "not in allow_domains", DenialEvidence.PROXY
    )
    assert denial_marker(proxied, "workspace-write", "isolated") == (
        "[sandbox: connect to evil.example:443 denied (not in allow_domains) under isolated "
        "network; add the domain to allow_domains or ask for network=host]"
    )
    family = _denial(
        DenialKind.SOCKET, "AF_VSOCK", "socket family", DenialEvidence.SUPERVISOR, "socket"
    )
    assert denial_marker(family, "read-only", "isolated").startswith(
        "[sandbox: socket AF_VSOCK denied (socket family) under read-only mode; "
    )
    protected = _denial(DenialKind.FILE_WRITE, "/srv/ws/.git/hooks/x", "protected name .git/hooks")
    assert "protected names stay read-only" in denial_marker(protected, "workspace-write", None)
    held = _denial(DenialKind.FILE_WRITE, "/srv/ws/.env", "held read-only inside a writable root")
    assert "protected names stay read-only" in denial_marker(held, "workspace-write", None)


def test_the_generic_marker_keeps_its_exact_text() -> None:
    assert (
        sandbox_denial_marker("read-only") == "[sandbox: file access denied under read-only mode]"
    )
    assert os.path.expanduser("~")  # the marker's home abbreviation has a home to compare
