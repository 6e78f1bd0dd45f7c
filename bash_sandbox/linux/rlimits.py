"""Resource limits (setrlimit) for what cgroups cannot bound here: which ones, and in which form.

Every setting lowers soft and hard together where the kernel enforces the hard limit, so
the command cannot raise it again (that needs CAP_SYS_RESOURCE in the initial user
namespace, which no confined command has). A limit is never set above the executor's own
hard limit: raising it would fail unprivileged, and the spawn with it.

Where each one counts (Linux >= 5.14, measured on 6.18; see tests/limits):

- RLIMIT_NPROC counts the tasks of one uid *in one user namespace* (and every ancestor
  namespace, against the limit that namespace's creator had). Set inside a user namespace
  made for this command alone, it bounds exactly the command's tree. Set before that
  namespace exists (e.g. before bwrap makes it), it also caps the uid's tasks in the
  parent namespace, which other commands share. It is never enforced for uid 0 of the
  initial namespace (root is exempt, inside a 0->0 mapped namespace too): root needs the
  pids cgroup.
- RLIMIT_DATA (private writable memory), RLIMIT_NOFILE and RLIMIT_CPU are per process.
  RLIMIT_DATA, not RLIMIT_AS: runtimes that reserve large address ranges up front
  (V8's cage, Go, sanitizers) would fail under an address-space limit.
"""

from __future__ import annotations

import fcntl
import functools
import os
import resource
from collections.abc import Callable
from typing import NamedTuple

from bash_sandbox.linux.sandbox_init import INIT_FD
from policies import ResourceLimits

RLIM_INFINITY = 2**64 - 1  # rlim_t's RLIM_INFINITY on Linux (Python spells it -1)
# RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one; a second apart, so the
# command dies of SIGXCPU (which says why) unless it ignores it.
CPU_HARD_GRACE_S = 1

_NAMES = {
    resource.RLIMIT_NPROC: "nproc",
    resource.RLIMIT_DATA: "data",
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_CPU: "cpu",
}


class RlimitSetting(NamedTuple):
    """One setrlimit(resource, soft, hard); values as rlim_t (RLIM_INFINITY for none)."""

    resource: int
    soft: int
    hard: int

    @property
    def name(self) -> str:
        return _NAMES[self.resource]


def _rlim(value: int) -> int:
    return RLIM_INFINITY if value < 0 else value


def current_rlimit(res: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(res)
    return _rlim(soft), _rlim(hard)


def render_rlimits(
    limits: ResourceLimits,
    *,
    cgroup_controllers: frozenset[str],
    current: Callable[[int], tuple[int, int]] = current_rlimit,
) -> tuple[RlimitSetting, ...]:
    """The rlimits a command needs beside the cgroup controllers it gets. Pure given
    ``current`` (the executor's own soft and hard limits, inherited by the child)."""
    out: list[RlimitSetting] = []

    def capped(res: int, soft: int, hard: int) -> None:
        cur_soft, cur_hard = current(res)
        hard = min(hard, cur_hard)
        soft = min(soft, hard)
        if (soft, hard) != (cur_soft, cur_hard):  # an unchanged limit costs nothing to skip
            out.append(RlimitSetting(res, soft, hard))

    if limits.processes is not None and "pids" not in cgroup_controllers:
        capped(resource.RLIMIT_NPROC, limits.processes, limits.processes)
    if limits.memory_bytes is not None and "memory" not in cgroup_controllers:
        capped(resource.RLIMIT_DATA, limits.memory_bytes, limits.memory_bytes)
    if limits.open_files is not None:
        # Only the hard limit bounds; the soft one stays what programs expect (often 1024,
        # select()-safe) unless it would exceed the new hard limit.
        cur_soft, _ = current(resource.RLIMIT_NOFILE)
        capped(resource.RLIMIT_NOFILE, cur_soft, limits.open_files)
    if limits.cpu_seconds is not None:
        capped(resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + CPU_HARD_GRACE_S)
    return tuple(out)


# The descriptors a child holds at fixed numbers while it sets the command up
# (`view_steps.STAGE_FD`, just below `sandbox_init.INIT_FD`): its open-files soft limit
# must exceed the higher one.
HELD_FDS = (INIT_FD - 1, INIT_FD)
HELD_FDS_TOP = max(HELD_FDS)


def descriptor_room(
    current: Callable[[int], tuple[int, int]] = current_rlimit,
) -> tuple[RlimitSetting, RlimitSetting] | None:
    """Where the executor's open-files soft limit leaves no room for the descriptors the
    child holds at fixed numbers (a caller under `ulimit -n 512`: every spawn failed with
    EBADF): the setting that makes room for the set-up, and the one that gives the command
    back the limits it would have had (set again before the command's own `apply_rlimits`).
    None where there is room. Raising the hard limit too (a hard limit below 1002) takes
    root; unprivileged, that step fails and says so."""
    soft, hard = current(resource.RLIMIT_NOFILE)
    need = HELD_FDS_TOP + 1
    if soft >= need:
        return None
    room = RlimitSetting(resource.RLIMIT_NOFILE, need, max(hard, need))
    return room, RlimitSetting(resource.RLIMIT_NOFILE, soft, hard)


@functools.cache
def reserve_held_fds() -> tuple[int, ...]:
    """Keep the numbers the child holds (1000, 1001) taken in this process where they are
    free, so that no descriptor the executor makes later (a namespace's, a listener's, that
    a child step names) gets one: the child's hold would overwrite it (a harness with ~990
    descriptors open: setns failed with EBADF). `F_DUPFD_CLOEXEC` takes the lowest free
    number from one up, never one in use; numbers the process already uses are its own and
    the child does not need them. Once per process; the numbers it holds."""
    held: list[int] = []
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for number in HELD_FDS:
            try:
                got = fcntl.fcntl(null, fcntl.F_DUPFD_CLOEXEC, number)
            except OSError:
                break  # past the open-files limit: nothing of ours is numbered there
            if got == number:
                held.append(got)
            else:
                os.close(got)  # in use: the process's own
    finally:
        os.close(null)
    return tuple(held)
