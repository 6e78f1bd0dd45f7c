"""The backend seam below the sandbox executor: probe, wrap a spawn, read the outcome.

Each backend module keeps a pure renderer (`policy -> argv / ruleset / profile`) apart from
the small part that applies it; this base only fixes the vocabulary they share.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.mount_plan import PlaceholderSources
from policies import SandboxEnforcement, SandboxPolicy


@dataclass(frozen=True)
class LayerReport:
    """How one layer (files, processes, network, unix sockets) is enforced on this host."""

    layer: str
    enforcement: str  # "full" | "partial" | "none"
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


class SandboxBackend(abc.ABC):
    """One way of confining a spawn. Instances are cheap; probing is cached by the executor."""

    name: str
    # bwrap reports a command killed by signal n as exit 128+n: such exits are never denials.
    folds_signals_into_exit_code: bool = False
    # The executor's network namespace under `isolated`: "required" (no namespace, no run),
    # "optional" (the backend isolates on its own without it), "none" (never used).
    network_namespace: str = "optional"

    @abc.abstractmethod
    def probe(self, timeout_ms: int) -> BackendProbe:
        """Check functionally (by confining a tiny command) whether this backend works here."""

    @abc.abstractmethod
    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> SpawnPlan:
        """Return the confined version of ``plan``. Raises `SandboxUnavailableError`."""

    @abc.abstractmethod
    def enforcement(self, policy: SandboxPolicy, ctx: BackendContext) -> SandboxEnforcement:
        """`full` when every right ``policy`` relies on is enforced on this host."""

    @abc.abstractmethod
    def is_denial(self, stderr: str) -> bool:
        """True when ``stderr`` of a failed, non-signal run shows this backend's denial dialect."""

    @abc.abstractmethod
    def runner_failure(self, exit_code: int | None, stderr: str) -> str | None:
        """The runner's own fatal line when the wrapper (not the command) failed, else None."""


@dataclass(frozen=True)
class BackendContext:
    """Per-executor resources a backend needs to wrap a spawn.

    ``netns_fd`` is the executor's prepared network namespace (None: the backend isolates the
    network itself or reports it partial); ``hidden_paths`` are executor-private paths (spill
    files of other runs) that no confined command may read.
    """

    sources: PlaceholderSources
    hidden_paths: tuple[str, ...] = ()
    netns_fd: int | None = None
    # Unprivileged executors: the user namespace owning ``netns_fd``, joined first.
    userns_fd: int | None = None
    private_tmp: str | None = None


def run_probe_command(
    argv: tuple[str, ...] | list[str],
    timeout_ms: int,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    preexec_fn: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a probe in its own process group; on timeout the whole group is SIGKILLed.

    Killing only the runner would leave a grandchild holding the pipes, and the read would
    hang past the timeout. Raises `subprocess.TimeoutExpired` after the group is dead.
    """
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
    )
    try:
        out, err = proc.communicate(timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
