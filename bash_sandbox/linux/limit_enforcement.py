"""How this host enforces each resource limit: a fact per limit, and a `full`/`partial` summary.

Pure given a `CgroupHost` (where cgroups may be made) and two facts about the spawn: does
every command get a user namespace of its own (which makes RLIMIT_NPROC count one tree),
and is the executor root of the initial user namespace (which RLIMIT_NPROC never binds).
`doctor` shows these; each `LimitsPlan` carries them for the result facts.
"""

from __future__ import annotations

import enum
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict

from bash_sandbox.linux.cgroups import CgroupHost, detect_this_host, read_text
from policies import ResourceLimits, SandboxEnforcement

LimitName = Literal[
    "memory", "processes", "cpu", "cpu-time", "open-files", "tmp-space", "shm-space"
]


class LimitMechanism(enum.StrEnum):
    """How the kernel enforces one limit on this host."""

    CGROUP_V1 = "cgroup-v1"
    CGROUP_V2 = "cgroup-v2"
    RLIMIT_PER_PROCESS = "rlimit (per process)"
    # RLIMIT_NPROC set inside the command's own user namespace: its tree alone.
    RLIMIT_PER_USER_NAMESPACE = "rlimit (per user namespace)"
    TMPFS_SIZE = "tmpfs size"
    NOT_ENFORCED = "not enforced"


class LimitEnforcement(BaseModel):
    """One limit as enforced here: a fact for `doctor` and the result facts."""

    model_config = ConfigDict(frozen=True)

    limit: LimitName
    mechanism: LimitMechanism
    value: int | float | None  # as configured; None: no limit of this kind asked for
    # True when the kernel enforces it as `ResourceLimits` means it (for the whole tree,
    # or per process where the limit is per process by definition).
    full: bool
    detail: str


def summarize_enforcement(enforcements: tuple[LimitEnforcement, ...]) -> SandboxEnforcement:
    """`full` when every configured limit is enforced as configured, else `partial`."""
    if all(e.full for e in enforcements if e.value is not None):
        return SandboxEnforcement.FULL
    return SandboxEnforcement.PARTIAL


def describe_enforcement(
    limits: ResourceLimits,
    host: CgroupHost | None = None,
    *,
    own_user_namespace: bool = True,
    nproc_exempt: bool | None = None,
    tmpfs: bool = True,
) -> tuple[LimitEnforcement, ...]:
    """How each limit of ``limits`` is enforced on ``host`` (this host when None).

    ``own_user_namespace``: every command gets a user namespace of its own and its rlimits
    are set inside it (what makes RLIMIT_NPROC count one tree). ``tmpfs``: the private
    /tmp and /dev/shm are tmpfs mounts of the configured sizes. ``nproc_exempt``: the
    executor is root of the initial user namespace (None: find out).
    """
    host = host if host is not None else detect_this_host()
    exempt = nproc_exempt if nproc_exempt is not None else is_nproc_exempt()
    have = host.controllers
    cgroup = LimitMechanism(host.version.value) if host.version is not None else None

    def entry(
        limit: LimitName, mechanism: LimitMechanism, value: float | None, full: bool, detail: str
    ) -> LimitEnforcement:
        return LimitEnforcement(
            limit=limit, mechanism=mechanism, value=value, full=full, detail=detail
        )

    out: list[LimitEnforcement] = []
    mem = limits.memory_bytes
    if mem is None:
        out.append(entry("memory", LimitMechanism.NOT_ENFORCED, None, True, "no limit set"))
    elif "memory" in have and cgroup is not None:
        what = "RAM and swap together" if host.swap_accounting else "RAM (no swap accounting)"
        out.append(entry("memory", cgroup, mem, True, f"{what}, for the whole tree"))
    else:
        why = host.why_missing("memory")
        out.append(
            entry(
                "memory",
                LimitMechanism.RLIMIT_PER_PROCESS,
                mem,
                False,
                f"RLIMIT_DATA per process, not per tree ({why})",
            )
        )
    procs = limits.processes
    if procs is None:
        out.append(entry("processes", LimitMechanism.NOT_ENFORCED, None, True, "no limit set"))
    elif "pids" in have and cgroup is not None:
        out.append(entry("processes", cgroup, procs, True, "tasks of the whole tree"))
    elif exempt:
        why = host.why_missing("pids")
        detail = f"root is exempt from RLIMIT_NPROC and the pids cgroup is unusable ({why})"
        out.append(entry("processes", LimitMechanism.NOT_ENFORCED, procs, False, detail))
    elif own_user_namespace:
        detail = "RLIMIT_NPROC inside the command's own user namespace: its tree alone"
        out.append(
            entry("processes", LimitMechanism.RLIMIT_PER_USER_NAMESPACE, procs, True, detail)
        )
    else:
        detail = "RLIMIT_NPROC shared by every command of the user namespace"
        out.append(
            entry("processes", LimitMechanism.RLIMIT_PER_USER_NAMESPACE, procs, False, detail)
        )
    cores = limits.cpu_cores
    if "cpu" in have and cgroup is not None:
        detail = (
            f"a quota of {cores} cores for the whole tree"
            if cores is not None
            else "no quota; the whole tree gets one scheduling share"
        )
        out.append(entry("cpu", cgroup, cores, True, detail))
    else:
        detail = f"no cpu cgroup ({host.why_missing('cpu')})"
        out.append(entry("cpu", LimitMechanism.NOT_ENFORCED, cores, cores is None, detail))
    per_process: tuple[tuple[LimitName, int | None, str], ...] = (
        ("cpu-time", limits.cpu_seconds, "RLIMIT_CPU"),
        ("open-files", limits.open_files, "RLIMIT_NOFILE"),
    )
    for limit, value, name in per_process:
        if value is None:
            out.append(entry(limit, LimitMechanism.NOT_ENFORCED, None, True, "no limit set"))
        else:
            out.append(
                entry(limit, LimitMechanism.RLIMIT_PER_PROCESS, value, True, f"{name}, per process")
            )
    tmpfs_sizes: tuple[tuple[LimitName, int, str], ...] = (
        ("tmp-space", limits.tmp_bytes, "/tmp"),
        ("shm-space", limits.shm_bytes, "/dev/shm"),
    )
    for limit, size, where in tmpfs_sizes:
        if tmpfs:
            detail = f"size of the private {where} tmpfs"
            out.append(entry(limit, LimitMechanism.TMPFS_SIZE, size, True, detail))
        else:
            detail = f"{where} is not a sized tmpfs here"
            out.append(entry(limit, LimitMechanism.NOT_ENFORCED, size, False, detail))
    return tuple(out)


def is_nproc_exempt() -> bool:
    """Root of the initial user namespace: the kernel never applies RLIMIT_NPROC to it
    (nor to its commands, whose uid 0 maps back to it)."""
    if os.geteuid() != 0:
        return False
    uid_map = (read_text("/proc/self/uid_map") or "").split()
    return uid_map == ["0", "0", "4294967295"]
