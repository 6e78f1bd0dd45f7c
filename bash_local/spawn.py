"""`SpawnPlan`: exactly what is handed to the kernel for one command; `SpawnScope`: its owner.

The local executor builds a plan (`bash -c`, scrubbed env, cwd) and asks for a scope around
it: `UnconfinedSpawn` runs the plan as it is; a confining executor returns a scope that
wrapped the plan (argv, a pre-exec step, the fds it needs) and holds what it acquired for
it until `close()`.
"""

from __future__ import annotations

import abc
import ctypes
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bash_seam import BashExecError, SandboxFacts, ShellNotFoundError, WorkdirError


def folded_signal(returncode: int | None) -> int | None:
    """n when a runner reported "killed by signal n" as exit status 128+n, else None.

    The one place the 128+n convention is read (bwrap and the Landlock backend's PID-1
    wrapper fold signals this way; so does any shell).
    """
    if returncode is not None and 128 < returncode < 128 + signal.NSIG:
        return returncode - 128
    return None


@dataclass(frozen=True)
class SpawnPlan:
    """One spawn. ``argv[0]`` is an absolute path; nothing is looked up on PATH later."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    # Runs in the child between fork and exec. It must only call pre-bound syscalls
    # (no imports, no allocation-heavy Python), because other threads may hold locks.
    preexec_fn: Callable[[], None] | None = None
    pass_fds: tuple[int, ...] = ()
    # Given back by the plan's scope when it closes (closes pass_fds...).
    release: Callable[[], None] | None = None
    # The program runs the command as a child and reports "killed by signal n" as exit
    # 128+n (bwrap does): when the executor killed the group, such an exit is read as n.
    folds_signals: bool = False
    # Spawns the plan instead of `subprocess.Popen` (a confining executor's spawn helper).
    launcher: Launcher | None = None


class LaunchedChild(abc.ABC):
    """A leader spawned by a `Launcher`, which is its parent and keeps it unreaped (so its
    pid, the group id, is never reused) until `wait()`."""

    pid: int

    @abc.abstractmethod
    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop once the leader has exited (not reaped)."""

    @abc.abstractmethod
    def wait(self) -> int:
        """Reap the exited leader; its return code as `Popen.returncode` reads it."""


class OwnChild:
    """A leader this process started itself without `subprocess.Popen` (a launcher that
    clones here): this process is its parent, so the executor watches and reaps it as it
    does a `Popen`'s leader."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        """Reap the leader (blocking until it exits); its return code as `Popen`'s."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


# What a spawn starts: a `Popen`, a leader parented elsewhere, or one of this process's own.
Started = subprocess.Popen[bytes] | LaunchedChild | OwnChild


_SA_NOCLDWAIT = {"linux": 0x2, "darwin": 0x20}
# Where `struct sigaction` keeps sa_flags: after the handler and a 1024-bit sa_mask on Linux
# (glibc and musl alike), after the handler and a 32-bit mask on macOS.
_SA_FLAGS_AT = {"linux": 8 + 128, "darwin": 8 + 4}


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def children_stay_to_be_reaped() -> bool:
    """Whether this process's exited children wait for it to read their status: not when
    it ignores SIGCHLD or set SA_NOCLDWAIT (a daemon's way never to wait), since the kernel
    then reaps them itself: a leader's exit status is lost (`Popen` reads 0) and its
    process group id may be reused before the group is killed. Read from the kernel's
    table (a C library may have set it without Python's `signal` knowing)."""
    platform = "darwin" if sys.platform == "darwin" else sys.platform[:5]
    if platform not in _SA_FLAGS_AT:
        return signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN
    action = ctypes.create_string_buffer(256)
    if _libc().sigaction(signal.SIGCHLD, None, action) != 0:
        return True  # cannot tell: as before
    handler = ctypes.c_void_p.from_buffer(action, 0).value
    flags = ctypes.c_int.from_buffer(action, _SA_FLAGS_AT[platform]).value
    return handler != int(signal.SIG_IGN) and not flags & _SA_NOCLDWAIT[platform]


def popen(plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    """``plan`` started by `subprocess.Popen`, its pre-exec step in the forked child."""
    return subprocess.Popen(
        plan.argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=plan.cwd,
        env=dict(plan.env),
        # A confining plan's pre-exec step; it calls only pre-bound syscalls.
        preexec_fn=plan.preexec_fn,  # noqa: PLW1509
        pass_fds=plan.pass_fds,
        # Own session: the pid is the group id we kill, and there is no controlling tty.
        start_new_session=True,
        close_fds=True,
    )


class Launcher(abc.ABC):
    """Spawns a plan in a new session with the given stdio descriptors, on the loop thread.
    Raises as `subprocess.Popen` does (OSError with the failing filename, or
    `subprocess.SubprocessError` for a failed pre-exec step): nothing runs then."""

    # Whether the leader is this process's own child (then `children_stay_to_be_reaped`
    # must hold), or another process's that reports its exit (a spawn helper).
    parents_here = True

    @abc.abstractmethod
    def launch(self, plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int) -> Started:
        """``stdin`` may be `subprocess.DEVNULL`."""

    @abc.abstractmethod
    async def launch_async(
        self, plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int
    ) -> Started:
        """`launch`, awaiting the answer instead of blocking the loop; a cancelled launch
        leaves nothing running."""


@dataclass(frozen=True)
class SpawnOutcome:
    """How one spawn ended, as `SpawnScope.settled` sees it (bounded output tails)."""

    exit_code: int | None
    signal: str | None
    timed_out: bool = False
    aborted: bool = False
    stdout: str = ""
    stderr: str = ""
    background: bool = False
    # False: the spawn itself failed and nothing ran (a background spawn still needs facts).
    started: bool = True


class SpawnScope(abc.ABC):
    """Everything one spawn holds, from its plan to its release: the executor's one hook.

    The executor calls, in order: `spawned()` once the process exists (or `failed()` if it
    never did), `settled()` once it has settled (also for a never-started background spawn),
    and `close()` exactly once, in a ``finally``, whatever happened before.
    """

    plan: SpawnPlan

    def spawned(self, pid: int, kill: Callable[[], None]) -> None:  # noqa: B027
        """Right after the spawn, on the loop thread; ``kill`` SIGKILLs the command's group.
        May raise: the command is killed and the error propagates."""

    @abc.abstractmethod
    async def settled(self, outcome: SpawnOutcome) -> SandboxFacts | None:
        """The facts of a settled command; runs (in a task of its own, on the loop) even
        when nobody awaits the run. A foreground run raises what this raises."""

    def failed(self, exc: BaseException) -> Exception:
        """The error to raise when the spawn itself failed (the plan's fds still open)."""
        plan = self.plan
        if isinstance(exc, OSError) and exc.filename == plan.cwd:
            return WorkdirError(f"workdir {plan.cwd!r} is unusable: {exc.strerror}")
        if isinstance(exc, FileNotFoundError) and exc.filename == plan.argv[0]:
            return ShellNotFoundError(f"{plan.argv[0]} could not be executed: {exc.strerror}")
        return BashExecError(f"could not spawn {plan.argv[0]}: {exc}")

    @abc.abstractmethod
    def close(self) -> None:
        """Give back everything the spawn held. Called exactly once."""


class UnconfinedSpawn(SpawnScope):
    """The local executor's scope: the plan as built, no facts, the plan's own release."""

    def __init__(self, plan: SpawnPlan) -> None:
        self.plan = plan

    async def settled(self, outcome: SpawnOutcome) -> SandboxFacts | None:
        return None

    def close(self) -> None:
        if self.plan.release is not None:
            self.plan.release()
