"""`SpawnPlan`: exactly what is handed to the kernel for one command, and the confinement hook.

The local executor builds a plan (`bash -c`, scrubbed env, cwd); a confining subclass may
rewrite it (wrap argv, add a pre-exec step and the fds it needs) before anything spawns.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass


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
    # Called exactly once after the process settled or the spawn failed (closes pass_fds...).
    release: Callable[[], None] | None = None
    # The program runs the command as a child and reports "killed by signal n" as exit
    # 128+n (bwrap does): when the executor killed the group, such an exit is read as n.
    folds_signals: bool = False
