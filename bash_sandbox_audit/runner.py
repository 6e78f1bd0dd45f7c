"""Running the catalog: every attack against every usable backend and mode, then cleaning up.

An `AuditSession` owns everything the audit creates and takes it all down again, also on
Ctrl-C or SIGTERM: its directories (victims under /var/tmp, executor state and the /tmp
victims under the real temp dir), the canary credentials it puts into its own environment
(restored afterwards), and every process of every attack (victims by pid; anything an
attacked command left behind by the run token in its environment or argv).

Attacks run concurrently but bounded (a semaphore; the target machine has 2 cores), each
with its own directory, executor(s) and time budget. A cell is `n/a` when the attack does
not apply, `not-enforceable` when the backend's probe says it is unusable here, and
otherwise whatever `verify` found; a process of the command that outlives the attack turns
any cell into ESCAPED (row 11 holds for every attack, not only row 11's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from bash_sandbox.backends.base import BackendProbe
from bash_sandbox.selection import candidate_backends
from bash_sandbox_audit.attacks import ATTACKS
from bash_sandbox_audit.layout import deny_read_paths
from bash_sandbox_audit.model import (
    CONFINED_MODES,
    LINUX_BACKENDS,
    Attack,
    AttackEnv,
    Finding,
    Verdict,
    audit_error,
    escaped,
)
from bash_sandbox_audit.targets import Cleanup, kill_tagged, wait_tagged_gone
from policies import SandboxMode

DEFAULT_CONCURRENCY = 4
HOOK_MARKER = "AUDIT-BASH-ENV-HOOK-RAN"
# Credential-shaped names put into the audit's own environment while it runs (real values,
# if any, are saved and restored; only random canaries are ever visible to a command).
CANARY_NAMES = (
    "GITHUB_TOKEN",
    "FOO_SECRET",
    "AWS_SECRET_ACCESS_KEY",
    "OPENAI_API_KEY",
    "DB_PASSWORD",
    "SERVICE_CREDENTIALS",
    "npm_config_authToken",
)


@dataclass(frozen=True)
class CellResult:
    """One attack on one backend in one mode."""

    attack_id: str
    row: int
    title: str
    kind: str
    backend: str
    mode: str
    verdict: Verdict
    detail: str = ""
    evidence: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def column(self) -> str:
        return f"{self.backend}/{self.mode}"

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["verdict"] = self.verdict.value
        out["evidence"] = list(self.evidence)
        return out


@dataclass(frozen=True)
class ProbeResult:
    backend: str
    usable: bool
    detail: str


@dataclass
class AuditReport:
    """Everything one audit found, in catalog order; `report.py` renders it."""

    columns: list[tuple[str, str]]
    attacks: list[Attack]
    results: list[CellResult]
    probes: dict[str, ProbeResult]
    host: dict[str, str]
    seconds: float = 0.0

    def cell(self, attack_id: str, backend: str, mode: str) -> CellResult | None:
        for r in self.results:
            if (r.attack_id, r.backend, r.mode) == (attack_id, backend, mode):
                return r
        return None

    @property
    def failed(self) -> list[CellResult]:
        return [r for r in self.results if r.verdict.fails]

    @property
    def exit_code(self) -> int:
        """0 only when nothing escaped, no control broke and the audit itself did not fail."""
        return 1 if self.failed else 0


def host_facts() -> dict[str, str]:
    from bash_sandbox.backends.landlock import landlock_abi

    return {
        "platform": platform.platform(),
        "kernel": platform.release(),
        "landlock_abi": str(landlock_abi()),
        "euid": str(os.geteuid()),
        "python": sys.version.split()[0],
        "cpus": str(os.cpu_count()),
    }


def _python_for_commands() -> str | None:
    """An interpreter commands can run inside the sandbox (a system one is simplest)."""
    for candidate in ("/usr/bin/python3", sys.executable):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("python3")


class AuditSession:
    """The audit's own world: directories, environment canaries, probes and cleanup."""

    def __init__(self, *, concurrency: int = DEFAULT_CONCURRENCY, keep: bool = False) -> None:
        self.concurrency = concurrency
        self.keep = keep
        self.base = ""
        self.state_root = ""
        self.token = os.urandom(6).hex()
        # A caller's label in every directory and token name of this run, so it can tell its
        # run's leftovers from a concurrent audit's (the tests do).
        self.tag = _run_tag()
        self.python = _python_for_commands()
        self.canaries: dict[str, str] = {}
        self._saved_env: dict[str, str | None] = {}
        self._saved_tempdir: str | None = None
        self._probes: dict[str, ProbeResult] = {}
        self._sem = asyncio.Semaphore(concurrency)
        self._tokens: set[str] = set()

    # -- setting up and tearing down the audit's world ------------------------------------

    async def __aenter__(self) -> AuditSession:
        real_tmp = tempfile.gettempdir()
        prefix = f"bash-sandbox-audit-{self.tag}-" if self.tag else "bash-sandbox-audit-"
        self.state_root = tempfile.mkdtemp(prefix=prefix, dir=real_tmp)
        # Victims live outside /tmp, where bwrap's private /tmp cannot hide them.
        victims_parent = "/var/tmp" if os.access("/var/tmp", os.W_OK) else self.state_root
        self.base = tempfile.mkdtemp(prefix=prefix, dir=victims_parent)
        os.makedirs(os.path.join(self.base, "s"))
        # Executors make their state and spill dirs with tempfile: inside our own dir.
        self._saved_tempdir = tempfile.tempdir
        tempfile.tempdir = self.state_root
        self._set_canaries()
        return self

    def _set_canaries(self) -> None:
        hook = os.path.join(self.base, "bash-env-hook.sh")
        with open(hook, "w") as fh:
            fh.write(f"echo {HOOK_MARKER}\n")
        values = {name: f"audit-canary-{name.lower()}-{self.token}" for name in CANARY_NAMES}
        values.update(BASH_ENV=hook, ENV=hook)
        for name, value in values.items():
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        self.canaries = values

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        for token in list(self._tokens):  # last line of defence, by pid
            kill_tagged(token)
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        tempfile.tempdir = self._saved_tempdir
        if not self.keep:
            for path in (self.base, self.state_root):
                if path:
                    _remove_tree(path)

    # -- probes ----------------------------------------------------------------------------

    def probe(self, backend: str) -> ProbeResult:
        """The backend's own functional probe, once per session."""
        if backend not in self._probes:
            try:
                found: BackendProbe = candidate_backends(backend).full[0].probe(10_000)
                result = ProbeResult(backend, found.usable, found.detail)
            except Exception as exc:  # a crashing probe is an unusable backend
                result = ProbeResult(backend, False, f"probe crashed: {exc}")
            self._probes[backend] = result
        return self._probes[backend]

    # -- one cell ------------------------------------------------------------------------------

    def _env(self, attack: Attack, backend: str, mode: SandboxMode) -> AttackEnv:
        name = f"{attack.id}.{backend}.{mode.value}"
        root = os.path.join(self.base, name)
        tmp_area = os.path.join(self.state_root, "tmp-victims", name)
        os.makedirs(root)
        os.makedirs(tmp_area)
        token = "bsa" + self.tag + os.urandom(8).hex()
        self._tokens.add(token)
        return AttackEnv(
            attack_id=attack.id,
            backend=backend,
            mode=mode,
            root=root,
            tmp_area=tmp_area,
            token=token,
            python=self.python,
            audit_pid=os.getpid(),
            cleanup=Cleanup(),
            sock_dir=os.path.join(self.base, "s"),
            deny_read=deny_read_paths(root),
            canaries=dict(self.canaries),
        )

    async def run_cell(self, attack: Attack, backend: str, mode: SandboxMode) -> CellResult:
        def result(finding: Finding, seconds: float = 0.0) -> CellResult:
            return CellResult(
                attack.id,
                attack.row,
                attack.title,
                attack.kind,
                backend,
                mode.value,
                finding.verdict,
                finding.detail,
                finding.evidence,
                round(seconds, 2),
            )

        if not attack.applies(backend, mode):
            return result(Finding(Verdict.NOT_APPLICABLE))
        probe = self.probe(backend)
        if not probe.usable:
            return result(Finding(Verdict.NOT_ENFORCEABLE, f"{backend} unusable: {probe.detail}"))
        async with self._sem:
            started = time.monotonic()
            env = self._env(attack, backend, mode)
            finding = audit_error("not run")
            try:
                finding = await asyncio.wait_for(self._attempt(attack, env), attack.budget_s)
            except TimeoutError:
                finding = audit_error(f"the attack exceeded its {attack.budget_s:.0f} s budget")
            except Exception as exc:
                finding = audit_error(f"the audit failed: {type(exc).__name__}: {exc}"[:300])
            finally:
                finding = await self._finish(env, finding)
            return result(finding, time.monotonic() - started)

    async def _attempt(self, attack: Attack, env: AttackEnv) -> Finding:
        setup = await attack.prepare(env)
        if setup.skip is not None:
            return Finding(Verdict.SKIPPED, setup.skip)
        outcome = await attack.drive(env, setup)
        return await attack.verify(env, setup, outcome)

    async def _finish(self, env: AttackEnv, finding: Finding) -> Finding:
        """Close executors, end the attack's own processes, and catch survivors (row 11)."""
        for ex in env.executors:
            with contextlib.suppress(Exception):
                await ex.aclose()
        await env.cleanup.run()
        survivors = await wait_tagged_gone(env.token, 3)
        if survivors:
            kill_tagged(env.token)
            if finding.verdict is not Verdict.ESCAPED:
                finding = escaped(
                    f"{len(survivors)} process(es) of the command outlived the attack",
                    [f"pid {p.pid}: {p.cmdline}" for p in survivors] + list(finding.evidence),
                )
        self._tokens.discard(env.token)
        if not self.keep:
            _remove_tree(env.root)
            _remove_tree(env.tmp_area)
        return finding

    # -- the matrix ----------------------------------------------------------------------------

    async def run_cells(self, cells: Sequence[tuple[Attack, str, SandboxMode]]) -> list[CellResult]:
        """Run cells concurrently (bounded by the session's semaphore), results in order."""
        # Long attacks (output floods, lifetimes) start first so they do not form the tail.
        order = sorted(range(len(cells)), key=lambda i: -cells[i][0].budget_s)
        started = {i: asyncio.ensure_future(self.run_cell(*cells[i])) for i in order}
        tasks = [started[i] for i in range(len(cells))]
        try:
            return list(await asyncio.gather(*tasks))
        except asyncio.CancelledError:
            # Interrupted: gather already cancelled every cell; each one's `finally` is now
            # cleaning up, which must not be cancelled a second time. Wait for all of them.
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def run_matrix(
        self, attacks: Sequence[Attack], backends: Sequence[str], modes: Sequence[SandboxMode]
    ) -> AuditReport:
        started = time.monotonic()
        report = AuditReport(
            columns=[(b, m.value) for b in backends for m in modes],
            attacks=list(attacks),
            results=[],
            probes={b: self.probe(b) for b in backends},
            host=host_facts(),
        )
        try:
            report.results = await self.run_cells(
                [(a, b, m) for a in attacks for b in backends for m in modes]
            )
        finally:
            report.seconds = round(time.monotonic() - started, 1)
        return report


def _remove_tree(path: str) -> None:
    """Remove a directory the audit made, also one whose modes deny traversal (mode 000)."""
    if not os.path.lexists(path):
        return

    def on_error(func: Any, failed: str, exc_info: Any) -> None:
        # Placeholder sources are mode 000/555 on purpose: open them up, then retry.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
        with contextlib.suppress(OSError):
            if os.path.isdir(failed) and not os.path.islink(failed):
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    shutil.rmtree(path, onerror=on_error)


def select(attack_globs: Iterable[str] = ()) -> list[Attack]:
    """Catalog entries whose id matches any glob (all of them without globs)."""
    import fnmatch

    globs = list(attack_globs)
    return [a for a in ATTACKS if not globs or any(fnmatch.fnmatch(a.id, g) for g in globs)]


async def run_audit(
    *,
    backends: Sequence[str] = LINUX_BACKENDS,
    modes: Sequence[SandboxMode] = CONFINED_MODES,
    attacks: Sequence[Attack] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    keep: bool = False,
) -> AuditReport:
    """Run the catalog (or ``attacks``) against ``backends`` x ``modes``; always cleans up."""
    async with AuditSession(concurrency=concurrency, keep=keep) as session:
        return await session.run_matrix(
            list(attacks if attacks is not None else ATTACKS), backends, modes
        )


__all__ = ["AuditReport", "AuditSession", "CellResult", "ProbeResult", "run_audit", "select"]


def _run_tag() -> str:
    """``BASH_SANDBOX_AUDIT_TAG`` when it is a short lowercase word (it goes into names and
    shell commands), else empty."""
    tag = os.environ.get("BASH_SANDBOX_AUDIT_TAG", "")
    if len(tag) <= 16 and tag.isascii() and tag.isalnum() and tag.islower():
        return tag
    return ""
