"""The outside view: checks that compare the host after an attack with before, and the
verifiers built from them.

A check returns evidence strings (empty: nothing escaped). `verify_attack` first demands
that the attack demonstrably ran (its markers are in the output), then runs the checks;
evidence makes the cell ESCAPED, or not-enforceable when the run's own facts already
declared the enforcement partial. `verify_control` is the inverse for positive controls.
The command's output is searched for canaries but never copied into a report.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence

from bash_sandbox_audit.layout import Secrets, compare
from bash_sandbox_audit.model import (
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    Verdict,
    Verify,
    audit_error,
    contained,
    escaped,
    skipped,
)
from bash_sandbox_audit.targets import CountingServer, Victim

# Checks look at the host from outside; the verifier lets in-flight effects (a delivered
# signal, a datagram) settle before calling them.
Check = Callable[[AttackEnv, AttackSetup, Outcome], list[str]]
SETTLE_S = 0.15


def guards_unchanged(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    return compare(
        setup.data["guards"], setup.data["before"], setup.data.get("placeholders", set())
    )


def no_escape_lines(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    return [
        line.strip()[:200]
        for line in outcome.all_output().splitlines()
        if line.startswith("ESCAPE ")
    ]


def victim_untouched(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    victim: Victim = setup.data["victim"]
    found = victim.findings()
    if victim.memory and victim.memory in outcome.all_output():
        found.append("the victim's memory canary appears in the command's output")
    if victim.secret and victim.secret in outcome.all_output():
        found.append("the victim's environment canary appears in the command's output")
    return found


def servers_silent(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    servers: list[CountingServer] = setup.data["servers"]
    return [f"{s.kind} server {s.address} was reached {s.hits} time(s)" for s in servers if s.hits]


def secrets_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    secrets: Secrets = setup.data["secrets"]
    text = outcome.all_output()
    found = [
        f"secret canary {c.split('-')[2]} in the command's output"
        for c in secrets.contents
        if c in text
    ]
    extra: Sequence[str] = setup.data.get("extra_canaries", ())
    found += [f"canary {c[:24]}... in the command's output" for c in extra if c in text]
    if setup.data.get("check_listing") and secrets.listed_name in text:
        found.append("a denied directory was listed (its hidden file name is in the output)")
    # Exfiltration into the workspace (host-visible) counts too.
    for dirpath, _dirs, files in os.walk(env.ws):
        for name in files:
            path = os.path.join(dirpath, name)
            # A link is no copy (and reading through it here would read the secret itself).
            if path.startswith(os.path.join(env.ws, "secrets")) or os.path.islink(path):
                continue
            try:
                with open(path, "rb") as fh:
                    data = fh.read(1 << 20)
            except OSError:
                continue
            for c in (*secrets.contents, *extra):
                if c.encode() in data:
                    found.append(f"secret canary copied into {os.path.relpath(path, env.ws)}")
    return found


def output_lacks(*needles: str) -> Check:
    def check(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
        text = outcome.all_output()
        return [f"output contains {n!r}" for n in needles if n in text]

    return check


def host_paths_absent(key: str) -> Check:
    """Paths in ``setup.data[key]`` (outside the sandbox) must not exist afterwards."""

    def check(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
        return [f"{p} exists on the host" for p in setup.data[key] if os.path.lexists(p)]

    return check


def shorten(env: AttackEnv, text: str) -> str:
    state_root = os.path.dirname(os.path.dirname(env.tmp_area))
    return (
        text.replace(env.root, "$ROOT").replace(env.tmp_area, "$TMP").replace(state_root, "$STATE")
    )


def why_contained(env: AttackEnv, outcome: Outcome) -> str:
    """The first denial the command met, for the report (paths shortened)."""
    for line in outcome.all_output().splitlines():
        if line.startswith("denied "):
            return shorten(env, line[7:])[:110]
    for line in outcome.stderr.splitlines():
        if line.strip():
            return shorten(env, line.strip())[:110]
    return "no effect outside the sandbox"


def _partial(outcome: Outcome, evidence: list[str]) -> str | None:
    """Why the run's own facts declared what the evidence shows uncovered (None: they did
    not). A run partial for another reason (inotify used up by another process, a search
    bound) proves nothing about this escape: it stays an escape (a red team's review). A
    partial with no reason of its own is the backend's, for this host and policy."""
    facts = outcome.result.sandbox if outcome.result is not None else None
    if facts is None:  # a background command's facts (stamped on its handle)
        facts = outcome.notes.get("facts")
    if facts is None or facts.enforcement is None or facts.enforcement != "partial":
        return None
    if not facts.warnings:
        return "the backend reports partial enforcement here"
    paths = {word.rstrip(".,:;)") for e in evidence for word in e.split() if word.startswith("/")}
    for warning in facts.warnings:
        if any(path and path in warning for path in paths):
            return f"the run declared it partial: {warning}"[:300]
    return None


def verify_attack(
    *checks: Check, markers: Sequence[str] = ("AUDIT-BEGIN",), python: bool = False
) -> Verify:
    """Contained when the attack demonstrably ran and every outside check found nothing."""

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        if outcome.error is not None:
            return audit_error(
                f"the run raised {type(outcome.error).__name__}: {outcome.error}"[:300]
            )
        text = outcome.all_output()
        wanted = [*markers, *(("PY-BEGIN",) if python else ())]
        missing = [m for m in wanted if m not in text]
        if missing:
            tail = shorten(env, outcome.stderr.strip()[-300:])
            return audit_error(
                f"premise failed: the attack did not run ({missing[0]} missing)",
                [tail] if tail else [],
            )
        if "PY-BEGIN" in wanted and "Traceback (most recent call last)" in text:
            # The program stopped at an exception: the attempts after it never ran, and an
            # attempt that never ran proves nothing contained.
            tail = shorten(env, outcome.stderr.strip()[-300:])
            return audit_error("premise failed: the attack program died before it finished", [tail])
        untried = [line for line in text.splitlines() if line.startswith("UNTRIED ")]
        if untried:
            return skipped(f"not tried on this host: {untried[0].removeprefix('UNTRIED ')}"[:300])
        evidence: list[str] = []
        await asyncio.sleep(SETTLE_S)  # signals reach a victim's handler at its next tick
        for check in checks:
            evidence += check(env, setup, outcome)
        if evidence:
            declared = _partial(outcome, evidence)
            evidence = [shorten(env, e) for e in evidence]
            if declared is not None:
                return Finding(Verdict.NOT_ENFORCEABLE, declared, tuple(evidence))
            return escaped(evidence[0], evidence)
        return contained(why_contained(env, outcome))

    return verify


def verify_control(*markers: str, checks: Sequence[Check] = ()) -> Verify:
    """A positive control passes when every marker shows up and every check is empty."""

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        if outcome.error is not None:
            return Finding(
                Verdict.BROKEN,
                f"the run raised {type(outcome.error).__name__}: {outcome.error}"[:300],
            )
        text = outcome.all_output() + str(outcome.notes.get("delta", ""))
        problems = [f"missing {m}" for m in markers if m not in text]
        for check in checks:
            problems += check(env, setup, outcome)
        if problems:
            tail = shorten(env, outcome.stderr.strip()[-300:])
            return Finding(Verdict.BROKEN, problems[0], tuple(problems + ([tail] if tail else [])))
        return Finding(Verdict.PASSED, "allowed work still works")

    return verify
