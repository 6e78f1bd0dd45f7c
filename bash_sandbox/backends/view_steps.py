"""The shared filesystem view applied as child steps, for both Linux backends.

The child has already joined the executor's mount namespace and unshared one of its own;
these steps turn that copy into the command's view (`mount_plan` says what the view is):

1. every mount made private: nothing mounted here reaches the executor's namespace, and no
   host mount made later propagates in (a host mount appearing under a path the command
   reaches would otherwise keep the host's flags, writable);
2. the git overlays, while their upper directories are still on a writable mount;
3. the whole tree read-only, nosuid and nodev in one atomic `mount_setattr(AT_RECURSIVE)`
   (so a mount the host made a moment ago is covered too), `/dev` keeping its device nodes
   for step 6, and the host's /proc writable (bwrap writes its uid map there; a fresh
   /proc covers it before the command runs). Kernels before 5.12 remount each mount of the
   parent's table instead;
4. a staging bind of the whole (read-only) view, held by descriptor: every later bind takes
   its source from the view as it was (like bwrap's `/oldroot`), so a source below a shadow
   is the host's, not the shadow's;
5. the plan's operations: the private /tmp, shadows, writable roots (writable again unless
   the host's own mount is read-only), pins, the git overlays inside them (writable again),
   protected names, covers. Everything in the stage is read-only, so a bind from it is
   read-only already; a writable one has its read-only flag cleared, nothing else;
6. a fresh /dev: the harmless host nodes, the executor's ptys and /dev/shm, read-only;
7. the stage detached, and the working directory re-entered (subprocess entered it before
   these mounts, so the old cwd still points beneath them).

The Landlock backend then forks its PID 1 and mounts /proc; bwrap takes this tree with
`--dev-bind / /` (recursively, keeping every flag set here) and adds its own /proc.
"""

from __future__ import annotations

import os
import re
import select
import threading

from bash_sandbox.backends.base import BackendContext, MountTable
from bash_sandbox.backends.linux_child import in_user_namespace, mount_overlays
from bash_sandbox.backends.mount_plan import MountOp
from bash_sandbox.linux.child_setup import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_RELATIME,
    MS_STRICTATIME,
    ChildSetup,
)
from bash_sandbox.linux.rlimits import HELD_FDS
from policies.paths import within

FRESH_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
FRESH_DEV_LINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
)

_MOUNT_OPTION_FLAGS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

# Where the child keeps the stage open: beside the held init, below the default 1024
# descriptor limit (the open-files rlimit is applied only after the stage is closed; a lower
# one is raised for the set-up, `rlimits.descriptor_room`).
STAGE_FD = HELD_FDS[0]
STAGE = f"/proc/self/fd/{STAGE_FD}"


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mount_table(mountinfo: str) -> MountTable:
    """(mount point, per-mount flags, MS_RDONLY included) for each line of a mountinfo."""
    table: list[tuple[str, int]] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        flags = 0
        for option in fields[5].split(","):
            flags |= _MOUNT_OPTION_FLAGS.get(option, 0)
        table.append((_unescape_mountinfo(fields[4]), flags))
    return tuple(table)


class KeptMountTable:
    """One executor's copy of this process's mount table, read again only once the kernel
    says it changed: an open mountinfo polls POLLPRI after a mount or unmount in its
    namespace since the last poll (reading and parsing it was 0.085 ms of every spawn). The
    poll comes before the read, so a change during the read is polled next time. Its
    descriptor is the executor's (`close`); a fork opens its own (the open file and its poll
    state would be shared with the parent)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1
        self._poll = select.poll()
        self._table: MountTable | None = None

    def read(self) -> MountTable:
        with self._lock:
            if self._pid != os.getpid():
                self._close_locked()  # a fork's copy: the parent's stays open
                self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
                self._pid = os.getpid()
                self._poll = select.poll()
                self._poll.register(self._fd, select.POLLPRI)
            changed = bool(self._poll.poll(0))
            if self._table is None or changed:
                self._table = parse_mount_table(_read_all(self._fd))
            return self._table

    def close(self) -> None:
        with self._lock:
            self._close_locked()
            self._pid = -1

    def _close_locked(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._table = None


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="surrogateescape")


def read_mount_table() -> MountTable:
    """This process's mount table, read now."""
    fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return parse_mount_table(_read_all(fd))
    finally:
        os.close(fd)


def mount_of(path: str, table: MountTable) -> int:
    """Per-mount flags of the deepest mount holding ``path``."""
    best, flags = "", 0
    for point, point_flags in table:
        inside = within(path, point)
        if inside and len(point) >= len(best):
            best, flags = point, point_flags
    return flags


def apply_view(
    setup: ChildSetup,
    ctx: BackendContext,
    ops: tuple[MountOp, ...],
    table: MountTable,
    *,
    cwd: str,
    setattr: bool,
) -> None:
    """Steps 1-7 of the module docstring; ``setattr``: the kernel has mount_setattr(2)."""
    setup.make_mounts_private()
    mount_overlays(setup, ctx.view.overlays, in_user_namespace(ctx))
    if setattr:
        everything = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        setup.set_mount_attrs("/", add=everything, recursive=True)
        # Only the /dev mount itself: its submounts may hold a locked nodev.
        setup.set_mount_attrs("/dev", clear=MOUNT_ATTR_NODEV)
        # bwrap writes its uid map through this /proc; both backends mount a fresh /proc
        # over it before the command runs.
        setup.set_mount_attrs("/proc", clear=MOUNT_ATTR_RDONLY)
    else:
        for point, flags in table:
            if point == "/proc":  # as above: bwrap writes its uid map there
                continue
            # /dev keeps its device nodes for the fresh /dev (step 6), as above.
            dev = point == "/dev" or point.startswith("/dev/")
            setup.remount(point, flags | MS_RDONLY | MS_NOSUID | (0 if dev else MS_NODEV))
    setup.bind("/", ctx.stage, recursive=True)
    setup.hold_dir(ctx.stage, STAGE_FD)
    for op in ops:
        _apply_op(setup, op, table, setattr=setattr)
    _fresh_dev(setup, ctx, setattr=setattr)
    setup.unmount(STAGE)
    setup.close_fd(STAGE_FD)
    setup.chdir(cwd)


def _writable(setup: ChildSetup, target: str, host_flags: int, *, setattr: bool) -> None:
    """A bind just taken from the read-only stage, made writable unless the host's own
    mount there is read-only (the sandbox never grants more than the host)."""
    if host_flags & MS_RDONLY:
        return
    if setattr:
        setup.set_mount_attrs(target, clear=MOUNT_ATTR_RDONLY)
    else:
        setup.remount(target, host_flags | MS_NOSUID | MS_NODEV)


def _apply_op(setup: ChildSetup, op: MountOp, table: MountTable, *, setattr: bool) -> None:
    """One plan step; every bind source is taken from the stage (the view as it was)."""
    if op.kind == "tmpfs":
        setup.mount_fs("tmpfs", op.target, MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    elif op.kind == "mkdir":
        setup.make_dir(op.target)
    elif op.kind == "mkfile":
        setup.create_file(op.target, 0o644)
    elif op.kind == "symlink":
        setup.symlink(op.source or "", op.target)
    elif op.kind == "readonly":
        setup.remount(op.target, MS_RDONLY | MS_NOSUID | MS_NODEV)
    elif op.kind == "overlay" and setattr:
        # Mounted in step 2, read-only since step 3 like all the stage: writable again here,
        # on the copy the writable root's bind just brought back.
        setup.set_mount_attrs(op.target, clear=MOUNT_ATTR_RDONLY)
    elif op.kind == "bind":
        source = STAGE + (op.source or op.target)
        if op.writable:
            setup.bind(source, op.target, recursive=True)
            _writable(setup, op.target, mount_of(op.target, table), setattr=setattr)
        elif setattr:
            # The stage is read-only, nosuid and nodev already: so is a bind taken from it.
            setup.bind(source, op.target, recursive=True, optional=op.optional)
        else:
            setup.bind_read_only(source, op.target, optional=op.optional)


def _fresh_dev(setup: ChildSetup, ctx: BackendContext, *, setattr: bool) -> None:
    """A tmpfs /dev with the harmless host nodes bound in, the executor's /dev/shm and ptys,
    read-only. Built on an empty staging directory while the host's /dev is still visible,
    then moved over /dev. The staging directory is reached through the stage, since the
    private /tmp may cover the executor's state."""
    stage = STAGE + ctx.sources.empty_dir
    setup.mount_fs("tmpfs", stage, MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in FRESH_DEV_NODES:
        setup.create_file(f"{stage}/{name}")
        setup.bind(f"/dev/{name}", f"{stage}/{name}")
    for target, link in FRESH_DEV_LINKS:
        setup.symlink(target, stage + link.removeprefix("/dev"))
    setup.make_dir(f"{stage}/pts")
    setup.make_dir(f"{stage}/shm")
    if ctx.scratch is not None:
        # The executor's own mounts, read-only and nodev since step 3: the ptys need their
        # device nodes (ptmx) back, /dev/shm only its writes.
        scratch = (
            ("pts", ctx.scratch.pts, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV),
            ("shm", ctx.scratch.shm, MOUNT_ATTR_RDONLY),
        )
        for name, source, clear in scratch:
            setup.bind(STAGE + source, f"{stage}/{name}")
            if setattr:
                setup.set_mount_attrs(f"{stage}/{name}", clear=clear)
    setup.move_mount(stage, "/dev")
    setup.remount("/dev", MS_RDONLY | MS_NOSUID | MS_NOEXEC)
