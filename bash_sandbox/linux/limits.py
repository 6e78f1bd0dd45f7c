"""Per-command resource limits: plan them in the parent, apply them in the child, read the outcome.

Lifetime, in the order the executor calls it:

1. `ExecutorLimits()` reads where this process may make cgroups (`cgroups.py`); it makes
   nothing yet. `enforcement(limits)` says, per limit, how this host enforces it.
2. `prepare(command_id, limits)`: on first use the per-executor parent cgroups
   (`bash-sandbox-<pid>-<token>` below the executor's own cgroup of each controller), then
   the command's cgroup: a slot an earlier command with the same settings left clean
   (0.04 ms), else a new one with its limits written (0.18 ms). The returned
   `LimitsPlan` holds what the child does before exec: write "0" into each
   `procs_files` entry (``tasks`` on v1, ``cgroup.procs`` on v2: the child moves *itself*,
   before it can fork or start a thread, so nothing of the tree starts outside), and the
   `rlimits` for what no cgroup covers.
   Every confined spawn has a pre-exec `ChildSetup`: `enter_cgroups` adds its first
   steps (before any namespace is joined), `apply_rlimits` its last ones before the filters.
3. `outcome(plan, exit_code=..., signal=...)` names the limit that stopped the command, from
   kernel counters (OOM kills, refused forks), SIGXCPU and full tmpfs roots only: never
   the command's output, which it could forge (an rlimit-bounded failure leaves no counter,
   so it is not named).
4. `release(plan)` once the command settled: SIGKILLs whatever is still in its cgroup (a
   daemonised grandchild), then keeps the cgroup as a slot for the next command when it
   is as a new one would be (no task, no limit counter above 0, no more memory charged
   than the kernel's per-CPU batches: `cgroups.cgroup_is_clean`; at most 8 a setting),
   else removes it (or retries later while the killed tasks are being reaped).
5. `close()` releases every plan and removes the parents; nothing it made stays under
   /sys/fs/cgroup. A parent left by an executor that was SIGKILLed is removed by the next
   executor of the same cgroup.

The executor's own process never enters a command's cgroup, so it is never charged.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import secrets
import signal as signal_module
import threading
import time
import weakref
from dataclasses import dataclass

from bash_sandbox.linux.cgroups import (
    CgroupHost,
    CgroupSetting,
    CgroupVersion,
    cgroup_is_clean,
    detect_this_host,
    kill_cgroup,
    parse_counter,
    read_text,
    remove_cgroup,
    render_cgroup_settings,
    write_setting,
)
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.limit_enforcement import (
    LimitEnforcement,
    LimitMechanism,
    describe_enforcement,
    summarize_enforcement,
)
from bash_sandbox.linux.rlimits import RlimitSetting, current_rlimit, render_rlimits
from policies import LimitExceeded, ResourceLimits, SandboxEnforcement

__all__ = [
    "ExecutorLimits",
    "LimitEnforcement",
    "LimitMechanism",
    "LimitsPlan",
    "LimitsSetupError",
    "apply_rlimits",
    "describe_enforcement",
    "enter_cgroups",
    "summarize_enforcement",
]

logger = logging.getLogger("bash_sandbox.limits")

PARENT_PREFIX = "bash-sandbox-"
_PARENT_NAME = re.compile(r"bash-sandbox-(\d+)-[0-9a-f]{8}")
# How long `close()` waits for SIGKILLed tasks to be reaped before giving up on a cgroup.
_CLOSE_WAIT_S = 5.0
# Idle cgroup slots kept per set of settings, and sets of settings kept.
_MAX_IDLE_SLOTS = 8
_MAX_SLOT_KINDS = 4
# A tmpfs root with less than this free (or no free inode) counts as full.
_FULL_BELOW_BYTES = 64 * 1024


class LimitsSetupError(OSError):
    """The command's cgroup could not be made or configured; nothing was spawned.

    Run it again; if it keeps failing, `bash-sandbox doctor` shows which limit cannot be
    enforced here, and `ResourceLimits` can drop that limit explicitly.
    """

    code = "LIMITS_SETUP_FAILED"


# Per cgroup hierarchy (its base directory), the settings a command's cgroup is made with.
Settings = tuple[tuple[str, tuple[CgroupSetting, ...]], ...]


@dataclass(frozen=True)
class LimitsPlan:
    """One command's limits, built in the parent; the child only writes and setrlimits."""

    command_id: str
    limits: ResourceLimits
    # Write b"0" into each, in the child, before anything else: it moves itself.
    procs_files: tuple[str, ...]
    # (resource, soft, hard), set by the child once it joined its namespaces.
    rlimits: tuple[RlimitSetting, ...]
    # (controller, directory) of this command's cgroups, for the outcome and the release.
    cgroups: tuple[tuple[str, str], ...]
    enforcement: tuple[LimitEnforcement, ...]
    # The command cgroup's name below each parent; None when no cgroup is used.
    cgroup_name: str | None = None
    # What its cgroups were made with (a later command with the same may reuse them).
    settings: Settings = ()

    @property
    def summary(self) -> SandboxEnforcement:
        return summarize_enforcement(self.enforcement)

    def cgroup_of(self, controller: str) -> str | None:
        return dict(self.cgroups).get(controller)


# -- applying a plan in the child ---------------------------------------------------------


def enter_cgroups(setup: ChildSetup, plan: LimitsPlan) -> None:
    """The child moves itself into its cgroups: the first steps, before any namespace is
    joined (later it may lack the rights to write there)."""
    for path in plan.procs_files:
        setup.write_file(path, b"0")


def apply_rlimits(setup: ChildSetup, plan: LimitsPlan) -> None:
    """setrlimit steps, once the child joined its namespaces. Where they run decides what
    RLIMIT_NPROC counts (rlimits.py): in a user namespace made for this command alone, its
    tree; in one several commands share (the executor's), all of them together."""
    for r in plan.rlimits:
        setup.set_rlimit(r.resource, r.soft, r.hard)


# -- the executor's side ------------------------------------------------------------------


def tmpfs_full(root: int | str | None) -> bool:
    """Whether the private tmpfs at ``root`` (a path or an fd) has no room left."""
    return _tmpfs_full(root)


def _tmpfs_full(root: int | str | None) -> bool:
    if root is None:
        return False
    try:
        st = os.statvfs(root)
    except OSError:
        return False
    no_inodes = st.f_files > 0 and st.f_favail == 0
    return no_inodes or st.f_bavail * st.f_frsize < _FULL_BELOW_BYTES


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ExecutorLimits:
    """One executor's cgroups: a parent per controller hierarchy, a child per command."""

    def __init__(self, host: CgroupHost | None = None) -> None:
        self._host = host if host is not None else detect_this_host()
        self._lock = threading.Lock()
        self._parents: dict[str, str] | None = None  # base directory -> our parent
        self._swap = self._host.swap_accounting
        self._counter = itertools.count(1)
        self._live: dict[str, LimitsPlan] = {}  # command cgroup name -> plan
        self._pending: list[str] = []  # cgroups whose killed tasks were not reaped yet
        # Slots: cgroups a command left clean, by what they were made with (`_keep_slot`).
        self._idle: dict[Settings, list[tuple[str, tuple[str, ...]]]] = {}
        self._described: dict[tuple[ResourceLimits, bool], tuple[LimitEnforcement, ...]] = {}
        self.warnings: list[str] = []
        # Every directory made and not yet removed; the finalizer of an executor dropped
        # without close() gets this set, never `self`.
        self._made: set[str] = set()
        self._finalizer = weakref.finalize(self, _remove_quietly, self._made)

    @property
    def host(self) -> CgroupHost:
        return self._host

    def enforcement(
        self, limits: ResourceLimits, *, own_user_namespace: bool = True
    ) -> tuple[LimitEnforcement, ...]:
        """How ``limits`` is enforced for this executor's commands (cached per limits)."""
        key = (limits, own_user_namespace)
        cached = self._described.get(key)
        if cached is None:
            cached = describe_enforcement(limits, self._host, own_user_namespace=own_user_namespace)
            self._described[key] = cached
        return cached

    # -- prepare ---------------------------------------------------------------------------

    def prepare(
        self, command_id: str, limits: ResourceLimits, *, own_user_namespace: bool = True
    ) -> LimitsPlan:
        """The command's cgroups (a slot left clean, or made now) and its plan. Raises
        `LimitsSetupError`."""
        with self._lock:
            self._retry_pending()
            parents = self._ensure_parents()
            settings = tuple(
                (
                    base.directory,
                    render_cgroup_settings(
                        limits, self._version, base.controllers, swap_accounting=self._swap
                    ),
                )
                for base in self._host.bases
            )
            slot = self._take_slot(settings)
            name, made = slot if slot is not None else self._make(parents, settings)
            cgroups = tuple(
                (controller, directory)
                for base, directory in zip(self._host.bases, made, strict=True)
                for controller in base.controllers
            )
            plan = LimitsPlan(
                command_id=command_id,
                limits=limits,
                procs_files=tuple(os.path.join(d, self._join_file) for d in made),
                rlimits=render_rlimits(
                    limits,
                    cgroup_controllers=self._host.controllers,
                    current=current_rlimit,
                ),
                cgroups=cgroups,
                enforcement=self.enforcement(limits, own_user_namespace=own_user_namespace),
                cgroup_name=name if made else None,
                settings=settings,
            )
            if made:
                self._live[name] = plan
            return plan

    def _take_slot(self, settings: Settings) -> tuple[str, tuple[str, ...]] | None:
        """An idle slot made with ``settings`` that is still there (nothing of ours removes
        one, but root may have)."""
        idle = self._idle.get(settings, [])
        while idle:
            name, directories = idle.pop()
            if all(os.path.isdir(d) for d in directories):
                return name, directories
            self._pending += directories  # whatever is left of it goes with the rest
        return None

    def _make(
        self,
        parents: dict[str, str],
        settings: Settings,
    ) -> tuple[str, tuple[str, ...]]:
        """A new command cgroup below each parent, its settings written."""
        name = f"cmd-{next(self._counter)}"
        made: list[str] = []
        try:
            for base_directory, wanted in settings:
                directory = os.path.join(parents[base_directory], name)
                os.mkdir(directory)
                made.append(directory)
                self._made.add(directory)
                for setting in wanted:
                    write_setting(directory, setting.file, setting.value)
        except OSError as exc:
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                    self._made.discard(directory)
            raise LimitsSetupError(
                exc.errno or 0, f"cannot set up the command's cgroup: {exc}"
            ) from exc
        return name, tuple(made)

    @property
    def _version(self) -> CgroupVersion:
        return self._host.version or CgroupVersion.V1

    @property
    def _join_file(self) -> str:
        """The file the child writes "0" into to join a cgroup. On v1, ``tasks``: it moves
        the writing thread alone, which for the single-threaded child is the whole process,
        and since Linux 6.0 it skips the global threadgroup lock whose write side waits an
        RCU grace period (cgroup.procs: 8-28 ms a command here, tasks: 0.3 ms). v2 has no
        such file for a domain cgroup; CLONE_INTO_CGROUP would be its equivalent."""
        return "tasks" if self._version is CgroupVersion.V1 else "cgroup.procs"

    def _ensure_parents(self) -> dict[str, str]:
        """On first use: the per-executor parents. If the host refuses them after all, fall
        back to rlimits and say so (`warnings`, and every plan's enforcement)."""
        if self._parents is not None:
            return self._parents
        parents: dict[str, str] = {}
        name = f"{PARENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            for base in self._host.bases:
                _sweep_stale_parents(base.directory)
                directory = os.path.join(base.directory, name)
                os.mkdir(directory, 0o755)
                parents[base.directory] = directory
                self._made.add(directory)
                if self._host.version is CgroupVersion.V2:
                    enable = " ".join(f"+{c}" for c in base.controllers)
                    write_setting(directory, "cgroup.subtree_control", enable)
                    self._swap = self._swap and os.path.exists(
                        os.path.join(directory, "memory.swap.max")
                    )
        except OSError as exc:
            for directory in parents.values():
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                    self._made.discard(directory)
            reason = f"cannot make the executor's cgroup: {exc}"
            self.warnings.append(f"resource limits fall back to rlimits: {reason}")
            logger.warning("%s", self.warnings[-1])
            self._host = CgroupHost(
                self._host.version, (), tuple((c, reason) for c in ("memory", "pids", "cpu"))
            )
            self._described.clear()
            parents = {}
        self._parents = parents
        return parents

    # -- outcome ---------------------------------------------------------------------------

    def outcome(
        self,
        plan: LimitsPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str = "",
        tmp_root: int | str | None = None,
        shm_root: int | str | None = None,
        full_before: tuple[bool, bool] = (False, False),
    ) -> LimitExceeded | None:
        """The limit that stopped the command, if one did; None for a successful run.

        Call it before `release(plan)` (the counters live in the command's cgroup).
        ``tmp_root``/``shm_root``: a path or an fd of the private tmpfs roots.
        ``stderr_text`` is accepted for old callers and ignored: text is no evidence.
        ``full_before``: whether each tmpfs was full already when the command started (the
        executor's commands share them): then its filling is no fact about this command.
        """
        if exit_code == 0 and signal is None:
            return None
        memory, pids = plan.cgroup_of("memory"), plan.cgroup_of("pids")
        if memory is not None:
            events = "memory.oom_control" if self._version is CgroupVersion.V1 else "memory.events"
            if parse_counter(read_text(os.path.join(memory, events)), "oom_kill") > 0:
                return LimitExceeded.MEMORY
        if (
            pids is not None
            and parse_counter(read_text(os.path.join(pids, "pids.events")), "max") > 0
        ):
            return LimitExceeded.PROCESSES
        if plan.limits.cpu_seconds is not None and (
            signal == "SIGXCPU" or exit_code == 128 + signal_module.SIGXCPU
        ):
            return LimitExceeded.CPU_TIME
        if not full_before[0] and _tmpfs_full(tmp_root):
            return LimitExceeded.TMP_SPACE
        if not full_before[1] and _tmpfs_full(shm_root):
            return LimitExceeded.SHM_SPACE
        # rlimit-bounded limits (open files; memory and processes without their cgroup) leave
        # no counter, and the command's own text is no evidence: it could print anything.
        return None

    # -- release and close -----------------------------------------------------------------

    def release(self, plan: LimitsPlan) -> int:
        """Kill what is left in the command's cgroups and remove them; returns how many
        leftover processes were killed (daemonised grandchildren). Idempotent."""
        with self._lock:
            killed = self._release_locked(plan)
            self._retry_pending()
            return killed

    def _release_locked(self, plan: LimitsPlan) -> int:
        if plan.cgroup_name is None or self._live.pop(plan.cgroup_name, None) is None:
            return 0  # no cgroup, or released already
        directories = tuple(dict.fromkeys(d for _, d in plan.cgroups))  # one per base, in order
        killed = 0
        for directory in directories:
            killed = max(killed, kill_cgroup(directory))
        if killed == 0 and self._keep_slot(plan, directories):
            return 0
        for directory in directories:
            if remove_cgroup(directory):
                self._made.discard(directory)
            else:
                self._pending.append(directory)
        return killed

    def _keep_slot(self, plan: LimitsPlan, directories: tuple[str, ...]) -> bool:
        """Keep a command's cgroups for the next command made with the same settings, when
        it left them as a new one would be (`cgroup_is_clean`): making and removing them
        was 0.3 ms of every command, and more of the kernel's in its workers."""
        assert plan.cgroup_name is not None
        idle = self._idle.get(plan.settings)
        if idle is None and len(self._idle) >= _MAX_SLOT_KINDS:
            return False
        if idle is not None and len(idle) >= _MAX_IDLE_SLOTS:
            return False
        held = {d: [c for c, d2 in plan.cgroups if d2 == d] for d in directories}
        if not all(cgroup_is_clean(d, held[d], self._version) for d in directories):
            return False
        self._idle.setdefault(plan.settings, []).append((plan.cgroup_name, directories))
        return True

    def _retry_pending(self) -> None:
        self._pending = [d for d in self._pending if not self._remove(d)]

    def _remove(self, directory: str) -> bool:
        removed = _try_remove(directory)
        if removed:
            self._made.discard(directory)
        return removed

    def close(self) -> None:
        """Release every command, then remove the parents. Idempotent."""
        with self._lock:
            for plan in list(self._live.values()):
                self._release_locked(plan)
            self._pending += [d for idle in self._idle.values() for _, ds in idle for d in ds]
            self._idle.clear()
            parents = list((self._parents or {}).values())
            deadline = time.monotonic() + _CLOSE_WAIT_S
            delay = 0.001
            while True:
                self._retry_pending()
                if not self._pending:
                    parents = [p for p in parents if not self._remove(p)]
                if not self._pending and not parents:
                    break
                if time.monotonic() > deadline:
                    left = self._pending + parents
                    self.warnings.append(f"cgroups still busy after close: {left}")
                    logger.warning("%s", self.warnings[-1])
                    break
                time.sleep(delay)  # SIGKILLed tasks are being reaped by their parents
                delay = min(delay * 2, 0.05)
            self._parents = None
            self._finalizer.detach()


def _try_remove(directory: str) -> bool:
    try:
        kill_cgroup(directory)
        return remove_cgroup(directory)
    except OSError as exc:
        logger.warning("removing cgroup %s failed: %s", directory, exc)
        return True  # not ours to retry forever


def _remove_quietly(made: set[str]) -> None:
    """Finalizer of an executor dropped without close(): best effort, deepest first."""
    with contextlib.suppress(Exception):
        for directory in sorted(made, key=len, reverse=True):
            _try_remove(directory)


def _sweep_stale_parents(base: str) -> None:
    """Remove parents left by executors that died without close() (their pid is gone)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        match = _PARENT_NAME.fullmatch(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        parent = os.path.join(base, name)
        with contextlib.suppress(OSError):
            for child in os.listdir(parent):
                if os.path.isdir(os.path.join(parent, child)):
                    _try_remove(os.path.join(parent, child))
            _try_remove(parent)
