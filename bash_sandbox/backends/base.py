"""The backend seam below the sandbox executor: probe, wrap a spawn, say what it enforces.

Each backend module keeps a pure renderer (`policy -> argv / ruleset / profile`) apart from
the small part that applies it; this base only fixes the vocabulary they share. The
executor builds one `BackendContext` per spawn (the host view, the executor's namespaces,
the supervisor's socket) and gets back a `ConfinedPlan`: the spawn plus what the executor
reads again when the command has settled.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from bash_local.spawn import SpawnPlan, children_stay_to_be_reaped
from bash_sandbox.backends.child_failure import read_child_failure
from bash_sandbox.backends.mount_plan import HostView, PlaceholderSources
from bash_sandbox.linux.child_setup import libc
from bash_sandbox.linux.limits import LimitsPlan
from bash_sandbox.linux.namespaces import NamespaceFds, ScratchPaths
from policies import NetworkMode, SandboxEnforcement, SandboxPolicy

Enforcement = Literal["full", "partial", "none"]
# How a backend uses the executor's network namespace under `isolated`: "required" (no
# namespace, no run), "optional" (it isolates on its own without it), "none" (never used).
NetworkNamespaceUse = Literal["required", "optional", "none"]


@dataclass(frozen=True)
class LayerReport:
    """How one layer (files, processes, network, unix sockets, ...) is enforced here."""

    layer: str
    enforcement: Enforcement
    how: str


@dataclass(frozen=True)
class BackendProbe:
    """Result of a functional probe: can this backend confine a command here, and how well."""

    backend: str
    usable: bool
    detail: str
    binary: str | None = None
    version: str | None = None
    layers: tuple[LayerReport, ...] = ()
    extra: dict[str, object] = field(default_factory=dict)


# (mount point, per-mount flags with MS_RDONLY) for each line of a mountinfo (`view_steps`).
MountTable = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class BackendContext:
    """Everything one spawn needs beyond the policy, prepared by the executor.

    ``namespaces`` is the executor's set (None: Landlock alone, which makes none);
    ``listener_fd`` is the child's end of the socket the seccomp listener is sent over.
    """

    sources: PlaceholderSources
    view: HostView = field(default_factory=HostView)
    namespaces: NamespaceFds | None = None
    scratch: ScratchPaths | None = None
    stage: str = ""
    # The executor's private TMPDIR for backends that mount nothing (Landlock alone, Seatbelt).
    private_tmpdir: str = ""
    listener_fd: int = -1
    limits: LimitsPlan | None = None
    # The spawn helper replays the child's steps: only their calls are recorded here.
    record_only: bool = False
    # The child holds the compiled init and execs it to wait in (`sandbox_init`): every
    # child of the spawn helper, and the compiled child from the executor's own process
    # (`compiled_launcher.py`); a child `Popen` forks from the executor waits as it is.
    hold_init: bool = False
    # The executor's mount table, as the host has it now (`view_steps.KeptMountTable`);
    # None: the backend reads it.
    mount_table: MountTable | None = None


@dataclass(frozen=True)
class ConfinedPlan(SpawnPlan):
    """A spawn plan a backend confined, with the pipe its child names a failed step on."""

    backend_name: str = ""
    report_fd: int | None = None
    # Where the runner says whether the command itself was started (bwrap's JSON status).
    status_fd: int | None = None
    # Called once the child exists: the executor's copies of what only the child needs go
    # (a hundred background commands must not hold three descriptors each for nothing).
    after_spawn: Callable[[], None] | None = None


class SandboxBackend(abc.ABC):
    """One way of confining a spawn. Instances are cheap; probing is cached by the executor."""

    name: str
    # The command runs under a wrapper that reports "killed by signal n" as exit 128+n.
    folds_signals: bool = False
    network_namespace: NetworkNamespaceUse = "required"
    # Without namespaces nothing private can be mounted: no /tmp, /dev/shm or git overlay.
    mounts: bool = True
    # The command runs in a user namespace of its own (its cgroups are delegated to it).
    own_user_namespace: bool = True
    # The errnos a refused write gets here, for reading the command's own messages (None:
    # a read-only mount's EROFS).
    write_refusals: frozenset[str] | None = None
    # Nothing private is mounted: the executor's private TMPDIR is the only scratch space.
    scratch_is_private_tmpdir: bool = False

    @property
    def binary(self) -> str | None:
        """The program the spawn executes before the command (bwrap), when there is one: it
        must not lie where a command could replace it."""
        return None

    @abc.abstractmethod
    def probe(self, timeout_ms: int) -> BackendProbe:
        """Check functionally (by confining a tiny command) whether this backend works here."""

    @abc.abstractmethod
    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> ConfinedPlan:
        """Return the confined version of ``plan``. Raises `SandboxUnavailableError`."""

    @abc.abstractmethod
    def enforcement(self, policy: SandboxPolicy) -> SandboxEnforcement:
        """`full` when every right ``policy`` relies on is enforced on this host."""

    def partial_reasons(self, policy: SandboxPolicy) -> tuple[str, ...]:
        """What this backend cannot hold for ``policy`` on any host, for the result's
        warnings (a `partial` is never silent); empty where `enforcement` alone says it."""
        return ()

    @abc.abstractmethod
    def layers(self, network: NetworkMode) -> tuple[LayerReport, ...]:
        """How each layer is enforced by this backend for ``network`` (for `doctor`)."""

    def runner_failure(
        self, exit_code: int | None, stderr: str, started: bool | None = None
    ) -> str | None:
        """The runner's own fatal line when the wrapper (not the command) failed, else None.
        ``started``: the runner's own word (`command_started`) that the command was
        started, where it gives one: then nothing the command printed is the runner's."""
        return None

    def command_started(self, plan: ConfinedPlan) -> bool | None:
        """Whether the runner started the command, on evidence the command cannot write;
        None where the runner gives none."""
        return None

    def explain_failure(self, plan: ConfinedPlan, exc: BaseException) -> str:
        """Why the spawn failed, in words: the child's failing step when it named one."""
        failure = read_child_failure(plan.report_fd)
        return str(failure) if failure is not None else str(exc)


def _with_default_sigchld(inner: Callable[[], object] | None) -> Callable[[], object]:
    """``inner`` preceded, in the forked child, by SIGCHLD set back to the default."""
    set_handler = libc().signal  # bound here, before the fork

    def preexec() -> object:
        set_handler(signal.SIGCHLD, 0)  # SIG_DFL, through the C library: no Python state
        return inner() if inner is not None else None

    return preexec


def run_probe_command(
    argv: tuple[str, ...] | list[str],
    timeout_ms: int,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    preexec_fn: Callable[[], object] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run a probe in its own process group; on timeout the whole group is SIGKILLed.

    Killing only the runner would leave a grandchild holding the pipes, and the read would
    hang past the timeout. Raises `subprocess.TimeoutExpired` after the group is dead.
    """
    if not children_stay_to_be_reaped():
        # This process ignores SIGCHLD, which the probe would inherit: bwrap then never sees
        # its own child exit (the probe timed out, and the backend was called unusable). Its
        # exit status reads 0 here: each probe's verdict stands on what the host sees.
        preexec_fn = _with_default_sigchld(preexec_fn)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=preexec_fn,  # noqa: PLW1509 - pre-bound syscalls only (child_setup.py)
        pass_fds=pass_fds,
    )
    try:
        out, err = proc.communicate(timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
