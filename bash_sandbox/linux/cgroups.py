"""Cgroups the executor may use: where they are, what to write, and how to empty and remove them.

Semantics: a command's cgroup is created below a per-executor parent, which is created below
the executor's *own* cgroup of each controller, so every limit an operator already put on
the executor (a container, a systemd unit, a CI job's memory group) still bounds its
commands. Nothing is ever moved out of its cgroup except the spawned child, which moves
itself into its command's cgroup before it execs.

- cgroup v1 (legacy and hybrid hosts): one directory per controller hierarchy (memory,
  pids, cpu); usable where the executor's cgroup directory of that controller is writable,
  which in practice means root.
- cgroup v2 (unified): one directory for every controller. A cgroup that holds processes
  cannot hand controllers to children (the "no internal processes" rule), and the
  executor lives in its own cgroup, so v2 is usable where that cgroup already delegates
  the controllers to its children (``cgroup.subtree_control``), or is the hierarchy's root
  (a container with a cgroup namespace), or where an operator names a delegated directory.

The parsing and rendering functions are pure (text in, values out); the rest touches
/sys/fs/cgroup and is kept small.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from policies import ResourceLimits

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
# Rounds of "list, SIGKILL the new ones" for a cgroup that keeps forking; a SIGKILLed task
# cannot fork again, so two rounds usually do.
_KILL_ROUNDS = 50


class CgroupVersion(enum.StrEnum):
    V1 = "cgroup-v1"
    V2 = "cgroup-v2"


@dataclass(frozen=True)
class CgroupBase:
    """Directory under which the executor makes its cgroups for ``controllers``."""

    directory: str
    controllers: tuple[str, ...]


@dataclass(frozen=True)
class CgroupHost:
    """What this process may use here: its bases, and why each missing controller is missing."""

    version: CgroupVersion | None
    bases: tuple[CgroupBase, ...] = ()
    missing: tuple[tuple[str, str], ...] = ()  # (controller, why it is unusable)
    swap_accounting: bool = False

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(c for base in self.bases for c in base.controllers)

    def why_missing(self, controller: str) -> str:
        return dict(self.missing).get(controller, "no cgroup hierarchy found")


@dataclass(frozen=True)
class CgroupSetting:
    """One file to write in a command's cgroup: ``controller`` picks the base."""

    controller: str
    file: str
    value: str


# -- discovery (pure parsing) ---------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMount:
    mount_point: str
    root: str  # the hierarchy path seen at the mount point (not "/" under a cgroup namespace)
    version: CgroupVersion
    controllers: tuple[str, ...]  # v1: from the super options; v2: empty here


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


def parse_cgroup_mounts(mountinfo: str) -> tuple[CgroupMount, ...]:
    """cgroup and cgroup2 mounts of /proc/self/mountinfo, in mount order."""
    mounts: list[CgroupMount] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        fstype, super_options = tail[0], tail[2].split(",")
        controllers: tuple[str, ...]
        if fstype == "cgroup2":
            version, controllers = CgroupVersion.V2, ()
        elif fstype == "cgroup":
            version = CgroupVersion.V1
            controllers = tuple(o for o in super_options if o in CONTROLLERS)
        else:
            continue
        mounts.append(CgroupMount(_unescape(fields[4]), _unescape(fields[3]), version, controllers))
    return tuple(mounts)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the v2 entry ("0::/path") is under ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _directory(mount: CgroupMount, path: str) -> str | None:
    """The directory of cgroup ``path`` under ``mount``, if the mount shows it."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    inside = path[len(root) :].strip("/")
    return os.path.join(mount.mount_point, inside) if inside else mount.mount_point.rstrip("/")


def detect_cgroup_host(
    proc_self_cgroup: str,
    mountinfo: str,
    *,
    read: Callable[[str], str | None],
    writable: Callable[[str], bool],
) -> CgroupHost:
    """Which cgroups this process may make. v1 wins where a resource controller is mounted
    as v1 (a hybrid host keeps them there, leaving v2 without controllers)."""
    mounts = parse_cgroup_mounts(mountinfo)
    paths = parse_proc_cgroup(proc_self_cgroup)
    v1 = [m for m in mounts if m.version is CgroupVersion.V1 and m.controllers]
    swap = False
    if v1:
        bases: list[CgroupBase] = []
        missing: list[tuple[str, str]] = []
        for controller in CONTROLLERS:
            mount = next((m for m in v1 if controller in m.controllers), None)
            path = paths.get(controller)
            directory = _directory(mount, path) if mount and path is not None else None
            if mount is None:
                missing.append((controller, f"no cgroup v1 {controller} hierarchy"))
            elif directory is None:
                missing.append((controller, f"our {controller} cgroup is not visible here"))
            elif not writable(directory):
                missing.append((controller, f"{directory} is not writable by this user"))
            else:
                bases.append(CgroupBase(directory, (controller,)))
                if controller == "memory":
                    swap = read(os.path.join(directory, "memory.memsw.limit_in_bytes")) is not None
        return CgroupHost(CgroupVersion.V1, tuple(bases), tuple(missing), swap)
    unified = next((m for m in mounts if m.version is CgroupVersion.V2), None)
    if unified is None or "" not in paths:
        return CgroupHost(None, (), tuple((c, "no cgroup hierarchy mounted") for c in CONTROLLERS))
    directory = _directory(unified, paths[""])
    if directory is None:
        reason = "our cgroup v2 is not visible here"
        return CgroupHost(CgroupVersion.V2, (), tuple((c, reason) for c in CONTROLLERS))
    is_root = directory.rstrip("/") == unified.mount_point.rstrip("/")
    return v2_host(directory, is_root=is_root, read=read, writable=writable)


def v2_host(
    directory: str,
    *,
    is_root: bool,
    read: Callable[[str], str | None],
    writable: Callable[[str], bool],
) -> CgroupHost:
    """A cgroup v2 directory as a base: the controllers it already hands to its children
    (the root may hand any of its own)."""
    offered = read(os.path.join(directory, "cgroup.subtree_control")) or ""
    if is_root:
        offered += " " + (read(os.path.join(directory, "cgroup.controllers")) or "")
    available = set(offered.split())
    usable = tuple(c for c in CONTROLLERS if c in available)
    if not writable(directory):
        why = f"{directory} is not writable by this user"
        return CgroupHost(CgroupVersion.V2, (), tuple((c, why) for c in CONTROLLERS))
    missing = tuple(
        (c, f"{directory} does not delegate the {c} controller to its children")
        for c in CONTROLLERS
        if c not in usable
    )
    bases = (CgroupBase(directory, usable),) if usable else ()
    # The root has no memory.swap.max of its own; the executor rechecks on its parent.
    swap = is_root or read(os.path.join(directory, "memory.swap.max")) is not None
    return CgroupHost(CgroupVersion.V2, bases, missing, swap and "memory" in usable)


def read_text(path: str) -> str | None:
    """The whole file, or None. os-level: a cgroup or /proc file is a read or two, and
    `open()` costs more than the reads (a command's release reads six of them)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def host_writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def detect_this_host() -> CgroupHost:
    """`detect_cgroup_host` for this process (a few small reads; no cgroup is made)."""
    return detect_cgroup_host(
        read_text("/proc/self/cgroup") or "",
        read_text("/proc/self/mountinfo") or "",
        read=read_text,
        writable=host_writable,
    )


# -- what to write (pure) -------------------------------------------------------------------


def render_cgroup_settings(
    limits: ResourceLimits,
    version: CgroupVersion,
    controllers: Iterable[str],
    *,
    swap_accounting: bool,
) -> tuple[CgroupSetting, ...]:
    """The files of one command's cgroup, in write order. Memory bounds RAM and swap
    together (v1 `memsw` after the RAM limit it must not undercut; v2 no swap at all)."""
    have = set(controllers)
    out: list[CgroupSetting] = []
    v1 = version is CgroupVersion.V1
    if "memory" in have and limits.memory_bytes is not None:
        mem = str(limits.memory_bytes)
        out.append(CgroupSetting("memory", "memory.limit_in_bytes" if v1 else "memory.max", mem))
        if swap_accounting and v1:
            out.append(CgroupSetting("memory", "memory.memsw.limit_in_bytes", mem))
        elif swap_accounting:
            out.append(CgroupSetting("memory", "memory.swap.max", "0"))
    if "pids" in have and limits.processes is not None:
        out.append(CgroupSetting("pids", "pids.max", str(limits.processes)))
    if "cpu" in have and limits.cpu_cores is not None:
        quota = max(1000, round(limits.cpu_cores * CPU_PERIOD_US))
        if v1:
            out.append(CgroupSetting("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)))
            out.append(CgroupSetting("cpu", "cpu.cfs_quota_us", str(quota)))
        else:
            out.append(CgroupSetting("cpu", "cpu.max", f"{quota} {CPU_PERIOD_US}"))
    return tuple(out)


def parse_counter(text: str | None, key: str) -> int:
    """``key N`` from a flat-keyed file (memory.events, pids.events, memory.oom_control)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


# -- the kernel side ----------------------------------------------------------------------


def write_setting(directory: str, file: str, value: str) -> None:
    with open(os.path.join(directory, file), "w") as fh:
        fh.write(value)


def cgroup_pids(directory: str) -> list[int]:
    text = read_text(os.path.join(directory, "cgroup.procs")) or ""
    return [int(p) for p in text.split() if p.isdigit()]


def kill_cgroup(directory: str) -> int:
    """SIGKILL everything in the cgroup (a daemonised grandchild that left the command's
    process group included); returns how many processes were signalled."""
    killed = 0
    if os.path.exists(os.path.join(directory, "cgroup.kill")):
        pids = cgroup_pids(directory)
        if pids:
            with contextlib.suppress(OSError):
                write_setting(directory, "cgroup.kill", "1")  # v2: atomic, races no fork
        return len(pids)
    signalled: set[int] = set()
    for _ in range(_KILL_ROUNDS):
        # Killed tasks stay listed until reaped: only new ones (forked meanwhile) need a
        # signal, and none new means the cgroup is only dying now.
        fresh = set(cgroup_pids(directory)) - signalled
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        signalled |= fresh
    return killed


# What an empty memory cgroup may still show charged: the kernel charges in batches of 64
# pages per CPU (MEMCG_CHARGE_BATCH), precharged and not yet used; a megabyte more of slab.
_CHARGE_SLACK = (1 << 20) + (os.cpu_count() or 1) * 64 * os.sysconf("SC_PAGE_SIZE")


def cgroup_is_clean(directory: str, controllers: Iterable[str], version: CgroupVersion) -> bool:
    """Whether a command's cgroup (of ``controllers``) is as a new one would be for the next
    command: no task in it, no limit hit (its counters are 0, so a later hit is the later
    command's), and no more memory charged than the kernel's batches hold (a page the
    command wrote to its private /tmp stays charged here, and would count against the
    next). A file it cannot read: not clean."""
    tasks = read_text(os.path.join(directory, "cgroup.procs"))
    if tasks is None or tasks.strip():
        return False
    v1, have = version is CgroupVersion.V1, set(controllers)
    counters: list[tuple[str, str]] = []
    if "memory" in have:
        counters.append(("memory.oom_control" if v1 else "memory.events", "oom_kill"))
    if "pids" in have:
        counters.append(("pids.events", "max"))
    for file, key in counters:
        text = read_text(os.path.join(directory, file))
        if text is None or parse_counter(text, key) != 0:
            return False
    if "memory" in have:
        usage = read_text(
            os.path.join(directory, "memory.usage_in_bytes" if v1 else "memory.current")
        )
        if usage is None or not usage.strip().isdigit() or int(usage) > _CHARGE_SLACK:
            return False
    return True


def remove_cgroup(directory: str) -> bool:
    """rmdir; False while dying processes still hold it (EBUSY) so the caller retries."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise
    return True
