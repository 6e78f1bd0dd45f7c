"""`SandboxBashExecutor`: the local executor with every confined spawn wrapped by a backend.

It stamps a complete policy on each spec in `resolve()`, wraps the spawn in `_confine()`,
and reads the outcome in `_outcome_facts()`. `danger-full-access` never reaches a backend:
the spawn is exactly the local executor's. When confinement cannot be guaranteed, it raises
`SandboxUnavailableError` before anything runs; it never falls back to an unconfined run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

from bash_local.config import LocalBashConfig
from bash_local.executor import LocalBashExecutor
from bash_local.output import SpillDirectory
from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.base import BackendContext, BackendProbe, SandboxBackend
from bash_sandbox.backends.mount_plan import (
    PlaceholderSources,
    make_placeholder_sources,
    symlinked_protected_paths,
)
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.denial import classify_denial, classify_network_denial
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.netns import NetnsError, NetworkNamespace
from bash_sandbox.selection import BackendSelector, candidate_backends
from bash_seam import BashExecRequest, BashExecSpec, SandboxFacts
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy
from policies.service import SandboxPolicyService


def shared_spill_base() -> str:
    """`$TMPDIR/bash-sandbox-spill-<uid>` (0700, ours), or a private dir if that is not safe.

    The temp dir is shared with other users: a pre-planted path, a symlink, or a directory
    owned by someone else or open to others is never used.
    """
    path = os.path.join(tempfile.gettempdir(), f"bash-sandbox-spill-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0:
        return path
    return tempfile.mkdtemp(prefix="bash-sandbox-spill-")


def remove_state_dir(path: str) -> None:
    """Delete a state dir, including its mode-000 placeholders and commands' temp files."""
    if not os.path.isdir(path):
        return
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), 0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class _Confinement:
    """What `_confine` decided, read back by `_outcome_facts` for the same spawn."""

    policy: SandboxPolicy
    backend: SandboxBackend
    enforcement: SandboxEnforcement
    report_fd: int | None = None


class SandboxBashExecutor(LocalBashExecutor):
    """Confines every command under the configured (or per-request) policy."""

    config_type: ClassVar[type[LocalBashConfig]] = SandboxBashConfig
    config: SandboxBashConfig

    def __init__(self, config: SandboxBashConfig | None = None, **overrides: Any) -> None:
        super().__init__(config if config is not None else SandboxBashConfig(), **overrides)
        cfg = self.config
        self._service = SandboxPolicyService(
            cfg.mode,
            cfg.workspace_root,
            cfg.network,
            writable_roots=cfg.writable_roots,
            protected_paths=cfg.protected_paths,
            deny_read=cfg.deny_read,
        )
        # Private state: placeholder mount sources, Landlock's TMPDIR, and the spill files,
        # which are hidden from every confined command.
        self._state_dir = tempfile.mkdtemp(prefix="bash-sandbox-")
        # An executor dropped without aclose() still removes its state dir.
        self._state_finalizer = weakref.finalize(self, remove_state_dir, self._state_dir)
        # Every executor of this user spills under one base that every sandbox hides, so no
        # confined command reads another run's spill files (its own executor's or another's).
        self._spill_parent = shared_spill_base()
        if cfg.spill_dir is None:
            self._spill_dir = SpillDirectory(self._spill_parent)
        self._sources: PlaceholderSources | None = None
        self._private_tmp = os.path.join(self._state_dir, "tmp")
        os.mkdir(self._private_tmp, 0o700)
        self._netns = NetworkNamespace()
        self._selector = BackendSelector(
            candidate_backends(
                cfg.backend,
                runner_command=tuple(cfg.runner_command),
                runner_failure_signatures=tuple(cfg.runner_failure_signatures),
            ),
            cfg.probe_timeout_ms,
        )

    @property
    def sandbox_mode(self) -> SandboxMode:
        return self.config.mode

    @property
    def policy_service(self) -> SandboxPolicyService:
        return self._service

    def probes(self) -> list[BackendProbe]:
        """The functional probe of each candidate backend (cached after the first call)."""
        return self._selector.probes()

    # -- resolve: stamp the policy ---------------------------------------------------------

    def resolve(self, request: BashExecRequest) -> BashExecSpec:
        spec = super().resolve(request)
        policy = request.sandbox_policy
        if policy is None:
            root = self.config.workspace_root or spec.workdir
            policy = self._service.resolve(mode=request.sandbox_mode, cwd=root)
        return spec.model_copy(update={"sandbox_policy": policy})

    def _policy_of(self, spec: BashExecSpec) -> SandboxPolicy:
        if spec.sandbox_policy is not None:
            return spec.sandbox_policy
        # A hand-built spec without a policy gets the executor's default, never none.
        root = self.config.workspace_root or spec.workdir
        return self._service.resolve(cwd=root)

    # -- confine the spawn -----------------------------------------------------------------

    def _context(self, policy: SandboxPolicy, backend: SandboxBackend) -> BackendContext:
        if self._sources is None:
            self._sources = make_placeholder_sources(self._state_dir)
        netns_fd: int | None = None
        userns_fd: int | None = None
        if policy.network is NetworkMode.ISOLATED and backend.network_namespace != "none":
            try:
                fds = self._netns.fds()
                netns_fd, userns_fd = fds.net, fds.user
            except NetnsError as exc:
                if backend.network_namespace == "required":
                    raise SandboxUnavailableError(
                        policy.mode, f"isolated network unavailable: {exc}"
                    ) from exc
                netns_fd = None  # bwrap isolates each command in its own namespace instead
        # This executor's spill dir exists before its first command, so it is always hidden.
        hidden: tuple[str, ...] = (self._spill_parent, self._spill_dir.ensure())
        return BackendContext(
            sources=self._sources,
            hidden_paths=hidden,
            netns_fd=netns_fd,
            userns_fd=userns_fd,
            private_tmp=self._private_tmp,
        )

    def _confine(self, spec: BashExecSpec, plan: SpawnPlan) -> SpawnPlan:
        policy = self._policy_of(spec)
        if not policy.confined:
            return plan  # danger-full-access: exactly the local executor's spawn
        backend = self._selector.choose(policy.mode)
        ctx = self._context(policy, backend)
        wrapped = backend.wrap(policy, plan, ctx)
        report_fd: int | None = None
        if isinstance(wrapped.preexec_fn, ChildSetup):
            # subprocess only says "exception in preexec_fn": the child names the step here.
            read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            wrapped.preexec_fn.report_failures_to(write_end)
            report_fd = read_end
            inner_release = wrapped.release

            def release() -> None:
                for fd in (read_end, write_end):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if inner_release is not None:
                    inner_release()

            wrapped = dataclasses.replace(wrapped, release=release)
        enforcement = backend.enforcement(policy, ctx)
        if symlinked_protected_paths(policy):
            enforcement = SandboxEnforcement.PARTIAL
        return dataclasses.replace(
            wrapped,
            signal_exit_codes=backend.folds_signals_into_exit_code,
            context=_Confinement(policy, backend, enforcement, report_fd),
        )

    def _spawn_error(self, spec: BashExecSpec, plan: SpawnPlan, exc: BaseException) -> Exception:
        confinement = plan.context
        if not isinstance(confinement, _Confinement):
            return super()._spawn_error(spec, plan, exc)
        detail = str(exc)
        if confinement.report_fd is not None:
            try:
                reported = os.read(confinement.report_fd, 4096).decode(errors="replace")
            except OSError:
                reported = ""
            if reported:
                detail = f"child setup failed at {reported}"
        if isinstance(exc, subprocess.SubprocessError | OSError) or detail:
            return SandboxUnavailableError(
                confinement.policy.mode, f"{confinement.backend.name} could not start: {detail}"
            )
        return super()._spawn_error(spec, plan, exc)

    # -- read the outcome ------------------------------------------------------------------

    def _outcome_facts(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str,
        background: bool,
    ) -> SandboxFacts | None:
        confinement = plan.context
        if not isinstance(confinement, _Confinement):
            return SandboxFacts(
                mode=self._policy_of(spec).mode,
                denied=False,
                enforcement=None,
                backend=None,
                network=NetworkMode.HOST,
            )
        policy, backend = confinement.policy, confinement.backend
        failure = backend.runner_failure(exit_code, stderr_text)
        if failure is not None:
            if not background:
                raise SandboxUnavailableError(policy.mode, failure)
            return SandboxFacts(
                mode=policy.mode,
                denied=False,
                enforcement=confinement.enforcement,
                runner_failed=True,
                backend=backend.name,
                network=policy.network,
            )
        folds = backend.folds_signals_into_exit_code
        denied = classify_denial(
            exit_code, signal, stderr_text, backend.is_denial, signals_as_exit=folds
        )
        network_denied = policy.network is NetworkMode.ISOLATED and classify_network_denial(
            exit_code, signal, stderr_text, signals_as_exit=folds
        )
        return SandboxFacts(
            mode=policy.mode,
            denied=denied,
            enforcement=confinement.enforcement,
            backend=backend.name,
            network=policy.network,
            network_denied=network_denied,
        )

    # -- lifetime ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await super().aclose()
        self._netns.close()
        self._remove_state()

    def _remove_state(self) -> None:
        """Remove the private state dir (spill files live elsewhere and stay readable)."""
        remove_state_dir(self._state_dir)
        self._sources = None
