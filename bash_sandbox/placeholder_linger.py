"""One executor's holds on host placeholders, shared in memory by its overlapping spawns,
and (when configured) directories kept for the next spawn a moment after the last one.

A workspace-write spawn holds a host placeholder for each missing auto-run name (28 empty
directories by default, `placeholders.py`): made and taken away again, two ledger
transactions and 56 renames of every spawn, the largest part of what workspace-write costs
over read-only. Here the ledger is asked only when this executor's first spawn needs a path
and when its last one lets it go: a spawn that overlaps another of the executor's (commands
at concurrency, a background command) takes the path over in memory.

`placeholder_linger_ms` (the executor's config, 0 by default) keeps a directory nobody holds
any more, still held in the ledger by this executor, for that long: a harness's next command
in a run of them takes it over with no ledger transaction at all. It is released as before
after that (on the loop's timer, or at the next acquire or release), before a
danger-full-access command of the executor (which must see the workspace as the local
executor would, `let_go`), and when the executor closes: removed while it is still an
untouched placeholder. Off by default: the user would see the empty directories in the
workspace for that long after each command. Only
directories linger: an empty placeholder file (a configured protected name such as
`deploy/secrets.env`) shows in the user's `git status`. A lingering directory protects what
it did before: the next command covers whatever is at the path (the placeholder, or what the
user put there since), and the ledger still names this executor, so no other one removes it
under a command; one the user filled, replaced or removed meanwhile is the user's
(`placeholders._untouched`), never removed by us.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable

from bash_sandbox.placeholders import Placeholders


class LingeringPlaceholders:
    """`Placeholders` for one executor's spawns, shared in memory; released directories kept
    for ``linger_s`` (0: none).

    Thread-safe: spawns acquire and release on the executor's loop, while the executor's
    finalizer may close it from any thread."""

    def __init__(self, inner: Placeholders, linger_s: float = 0.0) -> None:
        self._inner = inner
        self._linger_s = linger_s
        self._lock = threading.Lock()
        self._ledger_holds: Counter[str] = Counter()  # this executor's holds in the ledger
        self._users: Counter[str] = Counter()  # this executor's spawns holding each path now
        self._dirs: set[str] = set()  # which held paths are directories (only they linger)
        self._idle: dict[str, float] = {}  # path -> when its last spawn let it go
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def acquire_all(self, wanted: Iterable[tuple[str, bool]]) -> list[str]:
        """`Placeholders.acquire_all`; a path this executor holds already (for another
        spawn, or lingering) and still there is taken over in memory. The paths held, each
        to be given back once with `release_all`."""
        wanted = tuple(wanted)
        with self._lock:
            self._expire(keep={path for path, _ in wanted})
            taken = [p for p, _ in wanted if p in self._ledger_holds and os.path.lexists(p)]
            taken_set = set(taken)
            # A lingering one the user removed meanwhile: let go, then acquired as new.
            gone = [p for p, _ in wanted if p in self._idle and p not in taken_set]
            self._give_back(gone)
            rest = [(p, is_dir) for p, is_dir in wanted if p not in taken_set]
            held = self._inner.acquire_all(rest) if rest else []
            for path in held:
                self._ledger_holds[path] += 1
            made = set(held)
            self._dirs.update(p for p, is_dir in rest if is_dir and p in made)
            for path in (*taken, *held):
                self._users[path] += 1
                self._idle.pop(path, None)
            return [*taken, *held]

    def acquire(self, path: str, is_dir: bool) -> bool:
        return bool(self.acquire_all(((path, is_dir),)))

    def release_all(self, paths: Iterable[str]) -> None:
        """Give back one hold of each path: a directory nobody holds now lingers, anything
        else is released at once."""
        with self._lock:
            now = time.monotonic()
            free: list[str] = []
            for path in paths:
                self._users[path] -= 1
                if self._users[path] > 0:
                    continue
                del self._users[path]
                if path in self._dirs and self._linger_s > 0 and not self._closed:
                    self._idle[path] = now
                else:
                    free.append(path)
            self._give_back(free)
            self._expire(keep=set())
            if self._idle:
                self._schedule()

    def let_go(self) -> None:
        """Release the lingering directories now (no command of this executor holds them)."""
        with self._lock:
            self._give_back(list(self._idle))

    def close(self) -> None:
        """Release everything (the executor closes; its spawns are over, or being killed)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._users.clear()
            self._give_back(list(self._ledger_holds))

    def _expire(self, keep: set[str]) -> None:
        """Release the lingering paths idle for `LINGER_S` (but those in ``keep``)."""
        deadline = time.monotonic() - self._linger_s
        self._give_back(
            [p for p, since in self._idle.items() if since <= deadline and p not in keep]
        )

    def _give_back(self, paths: list[str]) -> None:
        """Drop every ledger hold this executor has on ``paths``, in one transaction."""
        if not paths:
            return
        drops = []
        for path in paths:
            self._idle.pop(path, None)
            self._dirs.discard(path)
            drops += [path] * self._ledger_holds.pop(path, 0)
        self._inner.release_all(drops)

    def _schedule(self) -> None:
        """A timer on the running loop for the earliest lingering path (none off a loop:
        the next acquire, release or close releases it)."""
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        due = min(self._idle.values()) + self._linger_s - time.monotonic()
        self._timer = loop.call_later(max(due, 0.0) + 0.01, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed:
                return
            self._expire(keep=set())
            if self._idle:
                self._schedule()
