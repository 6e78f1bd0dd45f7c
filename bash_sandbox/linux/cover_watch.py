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

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bash_sandbox.linux.inotify import (
    IN_IGNORED,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    NAME_CHANGES,
    SELF_CHANGES,
    Inotify,
    InotifyError,
)


class CoverWatchError(InotifyError):
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
        try:
            self._inotify = Inotify()
        except InotifyError as exc:
            raise CoverWatchError(exc.errno, exc.strerror) from exc
        self.fd: int = self._inotify.fd
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
        for event in self._inotify.read_events():
            if event.mask & IN_Q_OVERFLOW:
                overflow = True
                continue
            if event.mask & IN_IGNORED:  # the directory is gone: its watch with it
                self._forget(event.wd)
                continue
            directory = self._dir_of.get(event.wd)
            if directory is None:
                continue
            if event.mask & SELF_CHANGES:
                # The path now leads elsewhere: what was watched there has changed, and
                # the next watch of this path must be on whatever is there now.
                changed.add(directory)
                self._forget(event.wd)
                self._inotify.rm_watch(event.wd)
                continue
            if event.mask & NAME_CHANGES:
                changed.add(os.path.join(directory, event.name))
        for ticket in list(self._tickets):
            hits = [n for n in sorted(ticket.names) if overflow or _affected(n, changed)]
            for name in hits:
                if name in ticket.replaced:
                    continue
                ticket.replaced.append(name)
                if ticket.on_replaced is not None:
                    ticket.on_replaced(name)

    def close(self) -> None:
        self._inotify.close()
        self.fd = -1
        self._tickets.clear()
        self._wd_of.clear()
        self._dir_of.clear()

    def _add(self, directory: str) -> None:
        if directory in self._wd_of:
            return
        try:
            wd = self._inotify.add_watch(directory, NAME_CHANGES | SELF_CHANGES | IN_ONLYDIR)
        except InotifyError as exc:
            raise CoverWatchError(exc.errno, exc.strerror) from exc
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
