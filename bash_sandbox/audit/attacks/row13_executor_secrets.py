"""Row 13: the executor's secrets: inherited credentials and spill files."""

from __future__ import annotations

import os

from bash_sandbox.audit import drives
from bash_sandbox.audit.attacks.common import (
    BEGIN,
    attack,
    needs_python,
)
from bash_sandbox.audit.checks import (
    output_lacks,
    why_contained,
)
from bash_sandbox.audit.layout import (
    build_layout,
)
from bash_sandbox.audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    audit_error,
    contained,
    escaped,
)

# -- row 13: the executor's secrets ----------------------------------------------------------


def session_canaries_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = outcome.all_output()
    return [
        f"{name} from the executor's environment is visible"
        for name, value in env.canaries.items()
        if value in text
    ]


def environ_unread(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """`/proc/<executor>/environ` shows the environment the executor started with (later
    changes, like the audit's canaries, are not in it): any byte read is a leak."""
    for line in outcome.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["ENVIRON-BYTES"] and len(parts) == 2 and parts[1] != "0":
            return [f"{parts[1]} bytes of the executor's environment were readable"]
    return []


SPILL_FIRST = (
    '{{py}} -c \'import sys; sys.stdout.write(("AUDIT-SPILL-" + sys.argv[1] + '
    '"\\n") * 400)\' {{token}}'
)


def _verify_spill(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    if outcome.error is not None:
        return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
    spill = outcome.notes.get("spill_path")
    if not spill or outcome.result is None:
        return audit_error("premise failed: the first run did not spill")
    second = outcome.result.stdout.text + outcome.result.stderr.text
    if outcome.result.stdout.spill_path:  # a successful read overflows the small cap
        with open(outcome.result.stdout.spill_path, errors="replace") as fh:
            second = fh.read(1 << 20) + second
    if "AUDIT-BEGIN" not in second:
        return audit_error("premise failed: the second run did not start")
    evidence = []
    if f"AUDIT-SPILL-{env.token}" in second:
        evidence.append("another run's spill file was read")
    name = os.path.basename(spill)
    stem = name.split(".")[0]
    if len(stem) < 32 or any(c not in "0123456789abcdef" for c in stem):
        evidence.append(f"spill file name {name!r} is predictable")
    mode, dir_mode = outcome.notes.get("spill_mode"), outcome.notes.get("spill_dir_mode")
    if mode != 0o600 or dir_mode != 0o700:
        evidence.append(f"spill modes {mode:o}/{dir_mode:o} (want 600/700)")
    if evidence:
        return escaped(evidence[0], evidence)
    return contained(why_contained(env, outcome) or "spill unreadable")


def spill_attack(id: str, title: str, second: str, *, fresh: bool) -> Attack:
    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := needs_python(env):
            return AttackSetup(skip=why)
        build_layout(env)
        return AttackSetup(
            command=env.render(BEGIN + second, strict=False),
            data={"first": env.render(SPILL_FIRST), "fresh_executor": fresh},
        )

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        return _verify_spill(env, setup, outcome)

    return Attack(id, 13, title, prepare, verify, drives.two_runs)


ATTACKS: list[Attack] = [
    attack(
        "row13-credential-env",
        13,
        "credential-shaped variables of the executor "
        "(GITHUB_TOKEN, *_SECRET, *_KEY, *_PASSWORD, ...) and start-up hooks",
        "env; tr '\\0' '\\n' < /proc/self/environ; {{py}} -c 'import os; print(dict(os.environ))'",
        session_canaries_kept,
        output_lacks("AUDIT-BASH-ENV-HOOK-RAN"),
    ),
    attack(
        "row13-executor-environ",
        13,
        "read the executor's environment via /proc (what it held at start, credentials included)",
        "printf 'ENVIRON-BYTES %s\\n' \"$(wc -c < /proc/{{audit_pid}}/environ)\"; "
        "tr '\\0' '\\n' < /proc/{{audit_pid}}/environ",
        session_canaries_kept,
        environ_unread,
    ),
    spill_attack(
        "row13-spill-same-executor",
        "read the spill file of an earlier run of the same executor",
        "cat {{spill}}; ls -la {{spill_dir}} {{spill_parent}}; "
        "find {{spill_parent}} -type f -exec cat {} + 2>&1 | head",
        fresh=False,
    ),
    spill_attack(
        "row13-spill-other-executor",
        "read the spill file of another executor's run",
        "cat {{spill}}; ls -la {{spill_dir}} {{spill_parent}}; "
        "find {{spill_parent}} -type f -exec cat {} + 2>&1 | head",
        fresh=True,
    ),
    spill_attack(
        "row13-spill-search",
        "search the temp dirs for spill files without knowing the path",
        "timeout 20 grep -rl AUDIT-SPILL-{{token}} /tmp ${TMPDIR:-/tmp} "
        "2>/dev/null | "
        "head -20 | xargs -r cat 2>&1 | head -5",
        fresh=True,
    ),
]
