"""inotify through libc (ctypes): one instance, its watches, and a non-blocking drain.

Shared by the cover watch (`cover_watch.py`) and the repository search's watched tree
(`git_tree_watch.py`). fsnotify queues an event inside the filesystem call that makes it,
so once a call has returned, a drain sees its event (or IN_Q_OVERFLOW when the queue was
full). A watch is on an inode: a change made through any mount of it, in any mount
namespace (a sandbox's bind mounts), is seen.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

from bash_sandbox.linux.child_setup import libc

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONTFOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
# A name made, renamed onto, renamed away or removed.
NAME_CHANGES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
# The watched directory itself renamed or removed.
SELF_CHANGES = IN_MOVE_SELF | IN_DELETE_SELF
_EVENT = struct.Struct("iIII")
_READ_SIZE = 1 << 16


# Set by a process that exits right after its executor closes (the warm daemon's fork of
# one `bash-sandbox run`): its instances are then left to the exit to close. Closing one
# with watches waits for the kernel's fsnotify grace period, 15-16 ms here; the exit pays
# it too, but after the fork has answered its client.
_left_to_exit = False


def leave_closing_to_exit() -> None:
    """Every later `Inotify.close` in this process only forgets its descriptor (close-on-
    exec, so no child has it); for a process about to exit, never a long-lived one."""
    global _left_to_exit  # noqa: PLW0603 (one switch a process turns on once)
    _left_to_exit = True


class InotifyError(OSError):
    """inotify is unavailable, exhausted (the user's watch limit) or refused a path."""


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    name: str  # empty for an event on the watched directory itself


class Inotify:
    """One non-blocking, close-on-exec inotify instance."""

    def __init__(self) -> None:
        try:
            fd = libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except AttributeError as exc:  # no inotify in this libc (macOS)
            raise InotifyError(errno.ENOSYS, "inotify is not available") from exc
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd

    def add_watch(self, path: str, mask: int) -> int:
        """The watch descriptor of ``path``'s inode (the same one for the same inode)."""
        if self.fd < 0:
            raise InotifyError(errno.EBADF, "inotify instance closed")
        wd = libc().inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise InotifyError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        if self.fd >= 0:
            libc().inotify_rm_watch(self.fd, wd)

    def read_events(self) -> list[Event]:
        """Everything queued now, without blocking."""
        if self.fd < 0:
            raise InotifyError(errno.EBADF, "inotify instance closed")
        events: list[Event] = []
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return events
            except InterruptedError:
                continue
            if not data:
                return events
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
                offset += _EVENT.size + length
                name = raw.split(b"\0", 1)[0].decode(errors="surrogateescape")
                events.append(Event(wd, mask, name))

    def close(self) -> None:
        if self.fd >= 0:
            if not _left_to_exit:
                os.close(self.fd)
            self.fd = -1
