"""The audit's vocabulary: an `Attack`, what it sets up, what running it produced, its verdict.

An `Attack` is data plus three hooks. `prepare` builds the host-side premise (victim files,
processes, servers) under the attack's own directory and returns an `AttackSetup`: the command
to run confined and how. A *drive* runs it (foreground, background then kill, ...) and records
an `Outcome`. `verify` then looks at the host from outside the sandbox and returns a `Finding`.
Positive controls are attacks too (``kind="control"``): they must succeed, or the backend is
reported broken instead of safe.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bash_sandbox.executor import SandboxBashExecutor
from bash_seam import AbortSignal, BashExecRequest, BashRunResult
from policies import NetworkMode, SandboxMode

if TYPE_CHECKING:
    # Only an annotation here: the CLI imports this module to build its parser.
    from bash_sandbox_audit.targets import Cleanup

# The variable every audited command carries, so a survivor can be found (and killed) by it.
TOKEN_VARIABLE = "BASH_SANDBOX_AUDIT_RUN"  # noqa: S105 - a variable name, no secret
LINUX_BACKENDS: tuple[str, ...] = ("bwrap", "landlock")
CONFINED_MODES: tuple[SandboxMode, ...] = (SandboxMode.READ_ONLY, SandboxMode.WORKSPACE_WRITE)
BOTH_MODES = frozenset(CONFINED_MODES)
READ_ONLY = frozenset({SandboxMode.READ_ONLY})
WORKSPACE_WRITE = frozenset({SandboxMode.WORKSPACE_WRITE})


class Verdict(enum.StrEnum):
    """One cell of the audit table."""

    CONTAINED = "contained"  # the attack ran and the host is unchanged
    ESCAPED = "ESCAPED"  # a must-hold of the threat model failed; evidence attached
    NOT_ENFORCEABLE = "not-enforceable"  # the backend cannot enforce this here and says so
    SKIPPED = "skipped"  # the premise cannot be set up on this host (never "contained")
    PASSED = "ok"  # a positive control worked
    BROKEN = "BROKEN"  # a positive control failed: the backend breaks allowed work
    ERROR = "ERROR"  # the audit itself failed; nothing was proven
    NOT_APPLICABLE = "n/a"  # the attack does not apply to this backend or mode

    @property
    def fails(self) -> bool:
        """Whether this cell makes `bash-sandbox audit` exit nonzero."""
        return self in (Verdict.ESCAPED, Verdict.BROKEN, Verdict.ERROR)


@dataclass(frozen=True)
class Finding:
    """A verdict with the reason or evidence behind it (never raw secret output)."""

    verdict: Verdict
    detail: str = ""
    evidence: tuple[str, ...] = ()


def contained(detail: str = "") -> Finding:
    return Finding(Verdict.CONTAINED, detail)


def escaped(detail: str, evidence: list[str] | tuple[str, ...] = ()) -> Finding:
    return Finding(Verdict.ESCAPED, detail, tuple(evidence))


def skipped(reason: str) -> Finding:
    return Finding(Verdict.SKIPPED, reason)


def audit_error(detail: str, evidence: list[str] | tuple[str, ...] = ()) -> Finding:
    return Finding(Verdict.ERROR, detail, tuple(evidence))


@dataclass(frozen=True)
class AttackSetup:
    """What `prepare` built: the command to confine, how to run it, and what `verify` needs.

    ``skip`` set means the premise could not be built here: the drive does not run and the
    cell says why. ``data`` holds host-side facts for `verify` (snapshots, pids, servers).
    """

    command: str = ""
    executor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout_ms: int = 15_000
    data: Mapping[str, Any] = field(default_factory=dict)
    skip: str | None = None


@dataclass
class Outcome:
    """What the drive observed. ``error`` is an exception `run()`/`start()` raised;
    ``texts`` is other output the host saw (a CLI's stdout, a background command's reads)."""

    result: BashRunResult | None = None
    error: BaseException | None = None
    results: list[BashRunResult] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)

    @property
    def stdout(self) -> str:
        return self.result.stdout.text if self.result is not None else ""

    @property
    def stderr(self) -> str:
        return self.result.stderr.text if self.result is not None else ""

    def all_output(self) -> str:
        parts = [r.stdout.text + r.stderr.text for r in self.results]
        if self.result is not None and self.result not in self.results:
            parts.append(self.stdout + self.stderr)
        parts.append(str(self.notes.get("helper_output", "")))
        parts += self.texts
        return "\n".join(parts)


_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./:+,-]*$")


@dataclass
class AttackEnv:
    """One attack on one backend in one mode: its private directories and its executors.

    Layout under ``root`` (all created by the audit): ``ws`` is the workspace, ``host`` the
    victim area outside it, ``home`` a fake home holding fake secrets, ``observe`` where
    victim processes and sockets live (not compared), ``tmp_area`` a victim dir in the real
    temp dir (bwrap hides /tmp in workspace-write; Landlock keeps it read-only).
    """

    attack_id: str
    backend: str
    mode: SandboxMode
    root: str
    tmp_area: str
    token: str
    python: str | None
    audit_pid: int
    cleanup: Cleanup
    sock_dir: str = "/tmp"
    deny_read: tuple[str, ...] = ()
    canaries: Mapping[str, str] = field(default_factory=dict)
    executors: list[SandboxBashExecutor] = field(default_factory=list)

    @property
    def ws(self) -> str:
        return os.path.join(self.root, "ws")

    @property
    def host(self) -> str:
        return os.path.join(self.root, "host")

    @property
    def home(self) -> str:
        return os.path.join(self.root, "home")

    @property
    def observe(self) -> str:
        return os.path.join(self.root, "observe")

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def executor(self, **overrides: Any) -> SandboxBashExecutor:
        """An executor confining with this env's backend and mode; closed by the runner."""
        kwargs: dict[str, Any] = {
            "backend": self.backend,
            "mode": self.mode,
            "workspace_root": self.ws,
            "cwd": self.ws,
            "deny_read": self.deny_read,
            "grace_ms": 500,  # kills escalate fast: the audit has a time budget
            "timeout_ms": 15_000,
        }
        kwargs.update(overrides)
        ex = SandboxBashExecutor(**kwargs)
        self.executors.append(ex)
        return ex

    def request(
        self, command: str, *, timeout_ms: int | None = None, signal: AbortSignal | None = None
    ) -> BashExecRequest:
        """A request whose processes all carry the run token in their environment."""
        return BashExecRequest(
            command=command,
            timeout_ms=timeout_ms,
            signal=signal,
            env={TOKEN_VARIABLE: self.token},
        )

    def render(
        self, template: str, extra: Mapping[str, str] | None = None, *, strict: bool = True
    ) -> str:
        """Fill ``{{name}}`` placeholders with this env's paths (checked shell-safe); with
        ``strict=False`` unknown names stay for a later pass."""
        values = {
            "ws": self.ws,
            "host": self.host,
            "home": self.home,
            "observe": self.observe,
            "root": self.root,
            "tmp": self.tmp_area,
            "victim": os.path.join(self.host, "victim.txt"),
            "py": self.python or "/nonexistent/python3",
            "token": self.token,
            "audit_pid": str(self.audit_pid),
            **(extra or {}),
        }

        def fill(match: re.Match[str]) -> str:
            if not strict and match.group(1) not in values:
                return match.group(0)
            value = values[match.group(1)]
            # Paths come from mkdtemp and our own names; anything else would need quoting.
            if not _SAFE_PATH.match(value):
                return shlex.quote(value)
            return value

        return re.sub(r"\{\{(\w+)\}\}", fill, template)


Prepare = Callable[[AttackEnv], Awaitable[AttackSetup]]
Verify = Callable[[AttackEnv, AttackSetup, Outcome], Awaitable[Finding]]
Drive = Callable[[AttackEnv, AttackSetup], Awaitable[Outcome]]
Kind = Literal["attack", "control"]


@dataclass(frozen=True)
class Attack:
    """One row of the catalog: a threat-model row number, its hooks, and where it applies."""

    id: str
    row: int
    title: str
    prepare: Prepare
    verify: Verify
    drive: Drive
    modes: frozenset[SandboxMode] = BOTH_MODES
    backends: frozenset[str] = frozenset(LINUX_BACKENDS)
    network: NetworkMode = NetworkMode.ISOLATED
    kind: Kind = "attack"
    budget_s: float = 45.0

    def applies(self, backend: str, mode: SandboxMode) -> bool:
        return backend in self.backends and mode in self.modes
