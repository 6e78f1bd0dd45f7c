"""`GitTreeWatch`: an executor's repository search (`find_dotgits`), kept current by inotify.

The first search of a root lists every directory below it the way `find_dotgits` does
(never below a `.git`, below a bare repository too, never into the executors' own
directories),
setting a watch on each directory before listing it: whatever is made in it after that is
in the queue. A later search drains the queue (`linux/dir_watch.py`) and lists again only
the directories that saw an event: a name made, removed or renamed lists the directory
again and forgets the listings at and below that name (a directory moved in is listed
fresh, with its subtree); a directory listed again that has a new subdirectory watches it,
then lists it. Directories with git's layout (`HEAD` with `objects` and `refs`, or with
`commondir`) are listed at every search: git's verdict on them can change with no name
changing. So after a command,
the `.git` entries it made are the ones in the directories its events named.

Any doubt answers with `find_dotgits` itself, never with the kept tree: the queue
overflowed, the mounts changed, a watch could not be set (the user's watch limit, this
executor's share of it, a directory it may not read, a filesystem whose changes may not
all pass through this kernel), the roots nest, a root was replaced, more directories than
the search's budget. A root replaced, an overflow or a mount rebuilds the tree at once; the
others wait `_RETRY_AFTER` searches before trying again. Without inotify (macOS) every search is
`find_dotgits`.
"""

from __future__ import annotations

import os
import stat
import threading

from bash_sandbox import git_discovery
from bash_sandbox.git_discovery import (
    DISCOVERY_BUDGET,
    EMPTY_LISTING,
    Listing,
    find_dotgits,
    scan_directory,
)
from bash_sandbox.linux.dir_watch import DirectoryWatch
from bash_sandbox.linux.inotify import InotifyError
from policies.paths import within, within_any

_RETRY_AFTER = 64  # searches answered by the walk after the tree could not be kept


class _Doubt(Exception):
    """The kept tree cannot be shown current: answer with the walk."""

    def __init__(self, retry_now: bool) -> None:
        super().__init__()
        self.retry_now = retry_now


class GitTreeWatch:
    """One executor's kept tree. Thread-safe: the survey searches on the executor's loop,
    `settle_git` on its settle threads."""

    def __init__(self, max_watches: int | None = None) -> None:
        self._lock = threading.RLock()  # close() may come from a finalizer on this thread
        self._max_watches = max_watches
        self._watch: DirectoryWatch | None = None
        self._roots: dict[str, tuple[int, int]] = {}  # root -> (st_dev, st_ino)
        self._nodes: dict[str, Listing] = {}
        self._layout: set[str] = set()  # nodes listed at every search
        # node -> itself when bare, then its `.git` entry (a bare one may hold a `.git` too)
        self._found: dict[str, tuple[str, ...]] = {}
        self._wait = 0
        self._closed = False
        # Counters for tests and the benchmark: searches answered from the tree (of which
        # ones it was rebuilt for), and by the walk.
        self.answered = 0
        self.rebuilt = 0
        self.walked = 0

    def find_dotgits(
        self, roots: tuple[str, ...], budget: int = DISCOVERY_BUDGET
    ) -> tuple[list[str], list[str]]:
        """What `find_dotgits(roots, budget)` answers now."""
        with self._lock:
            try:
                found = self._search(roots, budget)
            except _Doubt as doubt:
                self._reset(retry_now=doubt.retry_now)
                found = None
                if doubt.retry_now:
                    found = self._retry(roots, budget)
                    self.rebuilt += found is not None
            if found is not None:
                self.answered += 1
                return found, []
        self.walked += 1
        return find_dotgits(roots, budget)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._reset(retry_now=True)

    # -- the kept tree ---------------------------------------------------------------------

    def _retry(self, roots: tuple[str, ...], budget: int) -> list[str] | None:
        try:
            return self._search(roots, budget)
        except _Doubt as doubt:
            self._reset(retry_now=doubt.retry_now)
            return None

    def _search(self, roots: tuple[str, ...], budget: int) -> list[str] | None:
        if self._closed or _nested(roots) or any(_nested((r, *self._roots)) for r in roots):
            return None
        # A missing root, or the executors' own: the walk says what is (not) there.
        identities: dict[str, tuple[int, int]] = {}
        for root in roots:
            identity = _identity(root)
            if identity is None or root in git_discovery.executor_dirs():
                return None
            identities[root] = identity
        if self._wait > 0:
            self._wait -= 1
            return None
        if self._watch is None:
            try:
                self._watch = DirectoryWatch(self._max_watches)
            except InotifyError as exc:
                raise _Doubt(retry_now=False) from exc
        try:
            changes = self._watch.drain()
        except InotifyError as exc:
            raise _Doubt(retry_now=False) from exc
        if changes.lost:
            raise _Doubt(retry_now=True)  # which names changed is lost
        for path in changes.moved:
            if path in self._roots:
                raise _Doubt(retry_now=True)  # the root itself was renamed or removed
            if path in self._nodes:
                self._forget(path)
                changes.relist.add(os.path.dirname(path))
        for directory in sorted(changes.relist | self._layout, key=lambda p: p.count("/")):
            if directory in self._nodes:
                self._relist(directory, budget)
        for root, identity in identities.items():
            if root not in self._roots:
                self._roots[root] = identity
                self._list_new([root], budget)
            elif identity != self._roots[root]:
                raise _Doubt(retry_now=True)  # a path above it was replaced
        if len(self._nodes) > budget:
            raise _Doubt(retry_now=False)
        return sorted(
            entry
            for node, entries in self._found.items()
            if within_any(node, roots)
            for entry in entries
        )

    def _relist(self, directory: str, budget: int) -> None:
        old = self._nodes[directory]
        new = self._remember(directory)
        kept = {*new.subdirs, *new.dependencies}
        for child in (*old.subdirs, *old.dependencies):
            if child not in kept and child in self._nodes:
                self._forget(child)
        self._list_new([c for c in kept if c not in self._nodes], budget)

    def _list_new(self, directories: list[str], budget: int) -> None:
        """Watch, then list, each directory and every one below it."""
        assert self._watch is not None
        skip = git_discovery.executor_dirs()
        todo = list(directories)
        while todo:
            directory = todo.pop()
            if directory in skip or directory in self._nodes:
                continue
            if len(self._nodes) >= budget:
                raise _Doubt(retry_now=False)
            try:
                if not self._watch.add(directory):
                    continue  # gone already: its parent's watch saw it go
            except InotifyError as exc:
                raise _Doubt(retry_now=False) from exc
            listing = self._remember(directory)
            # Below a bare repository too, as the walk searches.
            todo += (*listing.subdirs, *listing.dependencies)

    def _remember(self, directory: str) -> Listing:
        # Unreadable now (its mode changed): nothing, as the walk finds; its watch says
        # when that changes.
        listing = scan_directory(directory) or EMPTY_LISTING
        self._nodes[directory] = listing
        self._found.pop(directory, None)
        found: tuple[str, ...] = (directory,) if listing.bare else ()
        if listing.dotgit:
            found += (directory.rstrip("/") + "/.git",)
        if found:
            self._found[directory] = found
        if listing.layout:
            self._layout.add(directory)
        else:
            self._layout.discard(directory)
        return listing

    def _forget(self, path: str) -> None:
        """Forget ``path``'s listing and everything below it, and their watches."""
        assert self._watch is not None
        todo = [path]
        while todo:
            directory = todo.pop()
            listing = self._nodes.pop(directory, None)
            if listing is None:
                continue
            self._watch.remove(directory)
            self._found.pop(directory, None)
            self._layout.discard(directory)
            todo += (*listing.subdirs, *listing.dependencies)

    def _reset(self, *, retry_now: bool) -> None:
        # Closing the instance drops every watch at once.
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._roots.clear()
        self._nodes.clear()
        self._layout.clear()
        self._found.clear()
        self._wait = 0 if retry_now else _RETRY_AFTER


def _identity(root: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(root)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _nested(roots: tuple[str, ...]) -> bool:
    """Whether two distinct roots nest: a directory would belong to two trees."""
    distinct = list(dict.fromkeys(roots))
    return any(a != b and within(a, b) for a in distinct for b in distinct)
