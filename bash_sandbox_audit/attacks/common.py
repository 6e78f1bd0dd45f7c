"""What every row module builds its attacks from: the shell and Python preludes, the standard
premise (layout, guards, rendered command), and the catalog-entry builders.

`attack` makes an entry whose premise is the standard layout, `victim_attack` one that also
starts a victim process, `control` a positive control, and `known_limit` wraps an attack no
path-based sandbox can contain so an escape is reported as not enforceable, never hidden.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bash_sandbox_audit import drives, scenarios
from bash_sandbox_audit.checks import (
    Check,
    guards_unchanged,
    no_escape_lines,
    shorten,
    verify_attack,
    verify_control,
    victim_untouched,
)
from bash_sandbox_audit.layout import (
    PROTECTED_PATHS,
    build_layout,
    guard_paths,
    placeholders,
    protected_guards,
    take,
)
from bash_sandbox_audit.model import (
    BOTH_MODES,
    Attack,
    AttackEnv,
    AttackSetup,
    Drive,
    Finding,
    Kind,
    Outcome,
    Verdict,
    Verify,
    audit_error,
)
from bash_sandbox_audit.programs import program_text
from bash_sandbox_audit.targets import (
    remove_path,
    start_victim,
)
from policies import SandboxMode

BEGIN = "echo AUDIT-BEGIN\n"
# A premise renders its commands with this (paths and the premise's plain values).
Render = Callable[[str], str]
Build = Callable[[AttackEnv, Render], dict[str, Any]]

# Prepended to every Python attack (bash_sandbox_audit/programs/prelude.py).
PRELUDE = program_text("prelude.py")


def py(body: str) -> str:
    """A Python attack as a bash heredoc (quoted: bash expands nothing inside)."""
    return "{{py}} - <<'PY'\n" + PRELUDE + body.strip("\n") + "\nPY\n"


# -- prepare helpers ---------------------------------------------------------------------------


def template_values(values: dict[str, Any]) -> dict[str, str]:
    """The premise's plain values (ports, pids, paths) usable as ``{{name}}`` in commands."""
    return {k: str(v) for k, v in values.items() if isinstance(v, str | int)}


def needs_python(env: AttackEnv) -> str | None:
    return None if env.python else "no python3 on this host to run the attack"


def premise(
    build: Build,
    *,
    git: str = "repo",
    python: bool = False,
    workspace_guard: bool | None = None,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    protected: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> Callable[[AttackEnv], Awaitable[AttackSetup]]:
    """Standard premise: the layout, ``extra``'s host-side premise (its plain values fill
    ``{{name}}`` placeholders), then ``build``'s drive data (``command``, ``steps``, ...)
    with its commands rendered; the guarded areas are snapshotted last."""

    async def prepare(env: AttackEnv) -> AttackSetup:
        if python and (why := needs_python(env)):
            return AttackSetup(skip=why)
        secrets = build_layout(env, git=git)
        values: dict[str, Any] = extra(env) if extra is not None else {}
        if "skip" in values:
            return AttackSetup(skip=str(values["skip"]))
        guards = guard_paths(env, workspace=workspace_guard)
        holes: set[str] = set()
        executor_kwargs = dict(kwargs or {})
        if protected:
            guards.update(protected_guards(env.ws))
            executor_kwargs.setdefault("protected_paths", PROTECTED_PATHS)
            holes = placeholders(env.ws)
        guards.update(values.pop("guards", {}))
        executor_kwargs.update(values.pop("executor_kwargs", {}))
        plain = template_values(values)

        def render(template: str) -> str:
            return env.render(template, plain)

        data: dict[str, Any] = {"guards": guards, "secrets": secrets, "placeholders": holes}
        data.update(values)
        data.update(build(env, render))
        data["before"] = take(guards)
        return AttackSetup(
            command=str(data.pop("command", "")),
            data=data,
            executor_kwargs=executor_kwargs,
            timeout_ms=int(data.get("timeout_ms", 15_000)),
        )

    return prepare


def prepare_files(
    template: str,
    *,
    git: str = "repo",
    python: bool = False,
    workspace_guard: bool | None = None,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    protected: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> Callable[[AttackEnv], Awaitable[AttackSetup]]:
    """The premise of a one-command attack: ``template`` (after the start marker)."""
    return premise(
        lambda env, render: {"command": render(BEGIN + template)},
        git=git,
        python=python or "{{py}}" in template,
        workspace_guard=workspace_guard,
        extra=extra,
        protected=protected,
        kwargs=kwargs,
    )


def attack(
    id: str,
    row: int,
    title: str,
    template: str,
    *checks: Check,
    python: bool = False,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    git: str = "repo",
    workspace_guard: bool | None = None,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    protected: bool = False,
    kwargs: dict[str, Any] | None = None,
    drive: Drive = drives.foreground,
    backends: Sequence[str] = ("bwrap", "landlock"),
    markers: Sequence[str] = ("AUDIT-BEGIN",),
) -> Attack:
    """A catalog entry whose premise is the standard layout (plus ``extra``)."""
    body = py(template) if python else template
    return Attack(
        id=id,
        row=row,
        title=title,
        prepare=prepare_files(
            body,
            git=git,
            python=python,
            workspace_guard=workspace_guard,
            extra=extra,
            protected=protected,
            kwargs=kwargs,
        ),
        verify=verify_attack(*checks, markers=markers, python=python),
        drive=drive,
        modes=modes,
        backends=frozenset(backends),
    )


FILES: tuple[Check, ...] = (guards_unchanged, no_escape_lines)


def known_limit(entry: Attack, why: str) -> Attack:
    """An attack no path-based sandbox can contain: an escape is reported as not
    enforceable, with ``why`` (documented in docs/threat-model-coverage.md), never hidden."""
    inner = entry.verify

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        finding = await inner(env, setup, outcome)
        if finding.verdict is Verdict.ESCAPED:
            return Finding(Verdict.NOT_ENFORCEABLE, why, finding.evidence)
        return finding

    return dataclasses.replace(entry, verify=verify)


def read_or_empty(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def cleanup_paths(env: AttackEnv, key: str, paths: list[str]) -> dict[str, Any]:
    for p in paths:
        env.cleanup.add(functools.partial(remove_path, p))
    return {key: paths}


async def with_victim(env: AttackEnv, values: dict[str, Any]) -> dict[str, Any]:
    assert env.python is not None
    victim = await start_victim(
        env.python,
        env.observe,
        env.host,
        os.path.join(env.host, "victim.txt"),
        env.cleanup,
        memory=f"AUDIT-MEMORY-{env.token}",
        secret=f"AUDIT-VICTIM-SECRET-{env.token}",
    )
    values.update(
        victim=victim, vpid=victim.pid, vaddr=victim.address, vfd=victim.held_fd, vsize=victim.size
    )
    return values


def victim_attack(
    id: str,
    row: int,
    title: str,
    template: str,
    *checks: Check,
    python: bool = False,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    setup_extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    needs: str | None = None,
) -> Attack:
    """An attack on a victim process the audit starts outside the sandbox."""
    body = BEGIN + (py(template) if python else template)

    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := needs_python(env):
            return AttackSetup(skip=why)
        if needs is not None and shutil.which(needs) is None:
            return AttackSetup(skip=f"{needs} is not installed here")
        secrets = build_layout(env)
        guards = guard_paths(env)
        values = await with_victim(env, setup_extra(env) if setup_extra else {})
        rendered = env.render(body, template_values(values))
        return AttackSetup(
            command=rendered,
            data={"guards": guards, "before": take(guards), "secrets": secrets, **values},
        )

    return Attack(
        id,
        row,
        title,
        prepare,
        verify_attack(*checks, victim_untouched, python=python),
        drives.foreground,
        modes=modes,
    )


def control(
    id: str,
    title: str,
    template: str,
    *markers: str,
    checks: Sequence[Check] = (),
    modes: frozenset[SandboxMode] = BOTH_MODES,
    git: str = "repo",
    drive: Drive = drives.foreground,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    row: int = 0,
) -> Attack:
    """A positive control (row 0: the general ones; a row's own controls name it)."""
    return Attack(
        id,
        row,
        title,
        prepare_files(template, git=git, python="{{py}}" in template, extra=extra),
        verify_control("AUDIT-BEGIN", *markers, checks=checks),
        drive,
        modes=modes,
        kind="control",
    )


# -- scenarios: several steps (confined runs, CLI calls, host actions) -----------------------


def scenario(
    id: str,
    row: int,
    title: str,
    build: Build,
    *checks: Check,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    git: str = "repo",
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    kwargs: dict[str, Any] | None = None,
    workspace_guard: bool | None = None,
    python: bool = False,
    markers: Sequence[str] = ("AUDIT-BEGIN",),
    drive: Drive = scenarios.steps,
    verify: Verify | None = None,
    kind: Kind = "attack",
    backends: Sequence[str] = ("bwrap", "landlock"),
) -> Attack:
    """A catalog entry driven by more than one run: ``extra`` builds the host-side premise
    (its plain values fill ``{{name}}`` placeholders), then ``build`` returns the drive's
    data (``steps`` for `scenarios.steps`, ``commands`` for `scenarios.in_own_process`,
    ``acts`` for `scenarios.while_running`) with its commands rendered. The guarded areas
    are snapshotted last, once the premise is complete."""

    prepare = premise(
        build, git=git, python=python, workspace_guard=workspace_guard, extra=extra, kwargs=kwargs
    )

    return Attack(
        id=id,
        row=row,
        title=title,
        prepare=prepare,
        verify=cli_worked(
            verify if verify is not None else verify_attack(*checks, markers=markers)
        ),
        drive=drive,
        modes=modes,
        backends=frozenset(backends),
        kind=kind,
    )


def cli_worked(inner: Verify) -> Verify:
    """Nothing is proven when a CLI call of the scenario crashed (a traceback, a timeout):
    a refusal must be the CLI's decision, not its failure."""

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        for call in outcome.notes.get("cli", []):
            if call["crashed"] or call["rc"] < 0:
                return audit_error(
                    f"the CLI call {' '.join(call['args'][:3])} ... failed (exit {call['rc']})",
                    [shorten(env, str(call["stderr"]))[-300:]],
                )
        return await inner(env, setup, outcome)

    return verify


def judged_by(finding: Callable[[AttackEnv, AttackSetup, Outcome], Finding]) -> Verify:
    """A verifier from a plain function that looks at the host and returns the finding."""

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        return finding(env, setup, outcome)

    return verify
