"""A host-side watch on the names a sandbox covers where they lie.

A cover is a mount on a dentry. When the host replaces the covered name (an editor's
atomic save, `passwd` rewriting `/etc/shadow`, a credential helper's rename) or deletes it,
the kernel detaches every mount on that dentry in every namespace: a command that is still
running then sees the new file at the old path, uncovered. Names in a directory the
executor shadows (a snapshot of the directory) or inside a git overlay are not affected;
the names covered in place are (protected names in a writable root, `deny_read` paths in a
system directory, a large directory or a writable root, and the same names missing when the
command started).

So the executor watches, with inotify, the directory of each such name for as long as a
command that covers it runs, and stops that command (SIGKILL to its whole tree) as soon as
the name is created, renamed onto, renamed away or deleted. The watch is set before the
spawn, so a change between the survey and the mount is caught too (the command is stopped
at once, before it runs anything). The result says why it was stopped. An overflowed event
queue cannot say which name changed, so it stops every command the watch holds.

What it cannot stop: the command runs for the moment between the host's rename and the
executor reading the event (the event loop's latency, well under a millisecond when idle).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bash_sandbox.linux.child_setup import libc

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# A name made, renamed onto, renamed away or removed: each one ends a cover on it.
NAME_CHANGES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
# The watched directory itself renamed or removed: every name below it has moved on.
SELF_CHANGES = IN_MOVE_SELF | IN_DELETE_SELF
_EVENT = struct.Struct("iIII")


class CoverWatchError(OSError):
    """inotify is unavailable or exhausted: the names cannot be watched."""


@dataclass
class WatchTicket:
    """One command's watched names; ``replaced`` holds what changed (first few)."""

    names: frozenset[str]
    on_replaced: Callable[[str], None] | None = None
    replaced: list[str] = field(default_factory=list)
    dirs: tuple[str, ...] = ()


class CoverWatch:
    """One inotify instance per executor; a watch per directory, shared by the commands
    that need it and kept while the executor lives (the same few directories come back on
    every spawn: adding and removing them each time costs more than keeping them)."""

    def __init__(self) -> None:
        fd = libc().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise CoverWatchError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd
        self._wd_of: dict[str, int] = {}
        self._dir_of: dict[int, str] = {}
        self._tickets: list[WatchTicket] = []

    def watch(
        self, names: Iterable[str], on_replaced: Callable[[str], None] | None = None
    ) -> WatchTicket:
        """Watch the directory of each name (the nearest existing one for a missing name)
        until `release`. Raises CoverWatchError when a directory cannot be watched."""
        # What happened before this ticket is for the tickets already there (this command's
        # covers are placed after it): delivered now, so it cannot stop this command.
        self.read_events()
        wanted = frozenset(os.path.normpath(n) for n in names)
        ticket = WatchTicket(wanted, on_replaced)
        ticket.dirs = tuple(sorted({_watch_point(n) for n in wanted}))
        for directory in ticket.dirs:
            self._add(directory)
        self._tickets.append(ticket)
        return ticket

    def release(self, ticket: WatchTicket) -> None:
        if ticket in self._tickets:
            self._tickets.remove(ticket)

    def read_events(self) -> None:
        """Drain the queue; call each affected ticket's ``on_replaced`` once per name."""
        changed: set[str] = set()
        overflow = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    overflow = True
                    continue
                if mask & IN_IGNORED:  # the directory is gone: its watch with it
                    self._forget(wd)
                    continue
                directory = self._dir_of.get(wd)
                if directory is None:
                    continue
                if mask & SELF_CHANGES:
                    # The path now leads elsewhere: what was watched there has changed, and
                    # the next watch of this path must be on whatever is there now.
                    changed.add(directory)
                    self._forget(wd)
                    libc().inotify_rm_watch(self.fd, wd)
                    continue
                if not mask & NAME_CHANGES:
                    continue
                name = raw.split(b"\0", 1)[0].decode(errors="surrogateescape")
                changed.add(os.path.join(directory, name))
        for ticket in list(self._tickets):
            hits = [n for n in sorted(ticket.names) if overflow or _affected(n, changed)]
            for name in hits:
                if name in ticket.replaced:
                    continue
                ticket.replaced.append(name)
                if ticket.on_replaced is not None:
                    ticket.on_replaced(name)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._tickets.clear()
        self._wd_of.clear()
        self._dir_of.clear()

    def _add(self, directory: str) -> None:
        if directory in self._wd_of:
            return
        mask = NAME_CHANGES | SELF_CHANGES | IN_ONLYDIR
        wd = libc().inotify_add_watch(self.fd, os.fsencode(directory), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise CoverWatchError(err, f"inotify_add_watch {directory}: {os.strerror(err)}")
        self._wd_of[directory] = wd
        self._dir_of[wd] = directory

    def _forget(self, wd: int) -> None:
        directory = self._dir_of.pop(wd, None)
        if directory is not None:
            self._wd_of.pop(directory, None)


def _watch_point(name: str) -> str:
    """The directory whose entries decide what ``name`` is: its parent, or for a name
    whose parent is missing, the nearest existing ancestor."""
    parent = os.path.dirname(name)
    while parent != "/" and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return parent


def _affected(name: str, changed: set[str]) -> bool:
    """A change of the name itself or of a directory on its way (a missing parent made,
    a parent renamed away) ends its cover."""
    probe = name
    while probe != "/":
        if probe in changed:
            return True
        probe = os.path.dirname(probe)
    return False
