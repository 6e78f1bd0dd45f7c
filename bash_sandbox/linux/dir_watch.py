"""`DirectoryWatch`: directories watched by path, and which of them changed since the last look.

A directory is watched for its names (made, removed, renamed in or out) and for itself
(renamed, removed, unmounted, its mode or owner changed). `drain()` reads every queued
event without blocking and says which watched directories must be listed again and which
paths no longer lead where they did; or that it cannot say (the kernel's queue
overflowed, or a filesystem was mounted or unmounted somewhere: a mount hides or shows
names with no event). The watches count against the user's `fs.inotify.max_user_watches`:
this watch takes at most a share of it (`limit`), and refuses more, as the kernel would.

Only directories on a filesystem whose every change goes through this kernel are watched
(`LOCAL_FILESYSTEMS`): on NFS, 9p, virtiofs or FUSE another machine, or the host of a VM,
changes names inotify never hears of.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
from dataclasses import dataclass, field

from bash_sandbox.linux.child_setup import libc
from bash_sandbox.linux.inotify import (
    IN_ATTRIB,
    IN_DONTFOLLOW,
    IN_EXCL_UNLINK,
    IN_IGNORED,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    IN_UNMOUNT,
    NAME_CHANGES,
    SELF_CHANGES,
    Inotify,
    InotifyError,
)

_MASK = NAME_CHANGES | SELF_CHANGES | IN_ATTRIB | IN_ONLYDIR | IN_DONTFOLLOW | IN_EXCL_UNLINK
# The share of the user's watches one watch takes; other tools (editors, the user's other
# executors) need theirs.
_SHARE = 4
_MAX_USER_WATCHES = "/proc/sys/fs/inotify/max_user_watches"
# statfs f_type of the disk and memory filesystems (linux/magic.h), by the name `doctor`
# shows ("ext4" for ext2 and ext3 too: one magic).
FILESYSTEM_MAGIC = {
    "ext4": 0xEF53,
    "xfs": 0x58465342,
    "btrfs": 0x9123683E,
    "tmpfs": 0x01021994,
    "ramfs": 0x858458F6,
    "f2fs": 0xF2F52010,
    "zfs": 0x2FC12FC1,
    "bcachefs": 0xCA451A4E,
    "overlayfs": 0x794C7630,
}
LOCAL_FILESYSTEMS = frozenset(FILESYSTEM_MAGIC.values())
_STATFS_SIZE = 256  # more than struct statfs on any ABI; f_type is its first word


def default_limit(path: str = _MAX_USER_WATCHES) -> int:
    try:
        with open(path) as fh:
            return int(fh.read().strip()) // _SHARE
    except (OSError, ValueError):
        return 8192 // _SHARE  # the kernel's old default


def filesystem_type(path: str) -> int | None:
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if libc().statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


@dataclass
class DirChanges:
    """What `drain` read: directories to list again (``relist``), paths that may lead to
    another directory now or to none (``moved``: their listings are stale, and so is
    everything below them), and whether nothing is known (``lost``: the queue overflowed,
    or the mounts changed)."""

    relist: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)
    lost: bool = False


class DirectoryWatch:
    """One inotify instance; a watch per directory path (one inode reached by two paths,
    through a bind mount, has one watch serving both)."""

    def __init__(self, limit: int | None = None) -> None:
        self._inotify = Inotify()
        self.limit = default_limit() if limit is None else limit
        self._paths: dict[int, set[str]] = {}
        self._wd: dict[str, int] = {}
        self._local: dict[int, bool] = {}  # st_dev -> on a LOCAL_FILESYSTEMS filesystem
        # Polled: POLLPRI once the mount table changed since the last poll (or the open).
        try:
            self._mounts: int = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self._inotify.close()
            raise InotifyError(exc.errno, f"cannot follow the mounts: {exc}") from exc
        self._mount_poll = select.poll()
        self._mount_poll.register(self._mounts, select.POLLPRI)

    def __len__(self) -> int:
        return len(self._paths)

    def add(self, path: str) -> bool:
        """Watch the directory at ``path`` (not following a symlink there); False when it
        is not a directory any more (its parent's watch saw it go). Raises InotifyError
        when it cannot be watched: the limit, EACCES, ENOSPC, a closed instance, not a
        local filesystem."""
        if len(self._paths) >= self.limit and path not in self._wd:
            raise InotifyError(errno.ENOSPC, f"more than {self.limit} directories to watch")
        try:
            wd = self._inotify.add_watch(path, _MASK)
        except InotifyError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return False
            raise
        if self._wd.get(path, wd) != wd:
            self.remove(path)  # the path leads to another inode now
        self._wd[path] = wd
        self._paths.setdefault(wd, set()).add(path)
        try:
            device = os.lstat(path).st_dev
        except OSError:
            return True  # gone: its parent's watch saw it go
        if device not in self._local:
            self._local[device] = filesystem_type(path) in LOCAL_FILESYSTEMS
        if not self._local[device]:
            self.remove(path)
            raise InotifyError(errno.EXDEV, f"{path}: not a local filesystem")
        return True

    def remove(self, path: str) -> None:
        wd = self._wd.pop(path, None)
        if wd is None:
            return
        paths = self._paths.get(wd, set())
        paths.discard(path)
        if not paths:
            # Its IN_IGNORED, still to come, names a descriptor no path maps to any more.
            self._paths.pop(wd, None)
            self._inotify.rm_watch(wd)

    def drain(self) -> DirChanges:
        """Every event queued now. Raises InotifyError when the instance is unusable."""
        changes = DirChanges()
        if self._mount_poll.poll(0):
            changes.lost = True  # a mount may cover or uncover any watched name
        for event in self._inotify.read_events():
            if event.mask & IN_Q_OVERFLOW:
                changes.lost = True
                continue
            paths = self._paths.get(event.wd)
            if not paths:
                continue
            if event.name:
                # An entry's own attributes change nothing the search reads; a directory's
                # are seen by its own watch.
                if event.mask & NAME_CHANGES:
                    changes.relist.update(paths)
                    changes.moved.update(os.path.join(p, event.name) for p in paths)
                continue
            if event.mask & (SELF_CHANGES | IN_UNMOUNT | IN_IGNORED):
                changes.moved.update(paths)  # the path leads elsewhere now, or nowhere
                if event.mask & IN_IGNORED:
                    for path in list(paths):
                        self._wd.pop(path, None)
                    self._paths.pop(event.wd, None)
            elif event.mask & IN_ATTRIB:
                changes.relist.update(paths)  # its mode: whether it can be listed
        return changes

    def close(self) -> None:
        self._inotify.close()
        if self._mounts >= 0:
            os.close(self._mounts)
            self._mounts = -1
        self._paths.clear()
        self._wd.clear()
