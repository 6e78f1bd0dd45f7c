"""Answers of a host process (a git question), kept while the files they came from are unchanged.

A spawn in a repository asks host git things whose answers depend only on a few files (its
config, its refs). Each answer is kept with the stamp of every file it depends on, present or
not: identity, kind, size, mtime and ctime of the entry and of what it leads to. The next
question checks the stamps (microseconds) instead of starting git (milliseconds); any change
asks again. No process can set a ctime back, so an edit that restores size and mtime is still
seen. An answer is never kept if one of its files changed within a clock tick of the
question ("racy git", as git's own index does): a second write in the same tick of a coarse
filesystem clock could leave every stamp as it was.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# One file's stamp: its own entry's and what it leads to (lstat, stat), None where missing.
Stat = tuple[int, int, int, int, int, int] | None
Stamp = tuple[Stat, Stat]

# A file changed this close before the question may have changed after it, unseen.
RACY_NS = 2_000_000_000


def stamps(paths: tuple[str, ...]) -> tuple[Stamp, ...]:
    """Each path's own entry and what it leads to: identity, kind, size, mtime, ctime."""
    return tuple((_stat(os.lstat, path), _stat(os.stat, path)) for path in paths)


def _stat(call: Callable[[str], os.stat_result], path: str) -> Stat:
    try:
        st = call(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeptAnswers(Generic[K, V]):
    """Answers per key, each with the paths it depends on and their stamps; the oldest goes
    first beyond ``limit``. Safe to share between threads (a race asks git twice)."""

    def __init__(self, limit: int = 64, racy_ns: int = RACY_NS) -> None:
        self.limit = limit
        self.racy_ns = racy_ns
        self._lock = threading.Lock()
        self._answers: dict[K, tuple[tuple[str, ...], tuple[Stamp, ...], V]] = {}

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: K) -> V | None:
        """The kept answer for ``key`` if none of its files changed since; else None."""
        with self._lock:
            known = self._answers.get(key)
        if known is None or stamps(known[0]) != known[1]:
            return None
        return known[2]

    def keep(self, key: K, watched: tuple[str, ...], asked_ns: int, answer: V) -> None:
        """Keep ``answer``, asked at ``asked_ns`` (wall clock, taken before the question),
        unless one of ``watched`` changed within a clock tick of it."""
        stamped = stamps(watched)
        if any(
            part is not None and part[5] >= asked_ns - self.racy_ns
            for stamp in stamped
            for part in stamp
        ):
            return
        with self._lock:
            self._answers.pop(key, None)
            while len(self._answers) >= self.limit:
                del self._answers[next(iter(self._answers))]
            self._answers[key] = (watched, stamped, answer)

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
