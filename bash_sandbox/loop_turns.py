"""Turns on the event loop for the executor's own synchronous work (a spawn's preparation).

`give_way()` lets every task a due timer or ready I/O wakes run before the caller goes on. A
plain `await asyncio.sleep(0)` does not: its continuation is queued before the loop looks at
its timers, and a timer's callback only queues the task it wakes, for the turn after; so a
task sleeping 1 ms would still wait for the caller's next chunk.

`LoopLock` is an `asyncio.Lock` for whichever loop uses the executor now. An executor may
serve one loop after another (a harness that calls `asyncio.run` per task); an
`asyncio.Lock` binds to the first loop that waits on it and refuses every other, and a
reader left on a finished loop is never called again: `follow_loop` moves it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


async def give_way() -> None:
    """Resume only after the tasks that due timers and ready I/O wake have run."""
    # Turn 1: the loop queues its due timer and I/O callbacks behind us. Turn 2: those run
    # and queue the tasks they wake, behind us again. Turn 3: we go after those tasks.
    for _ in range(3):
        await asyncio.sleep(0)


class LoopLock:
    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def lock(self) -> asyncio.Lock:
        """The running loop's lock (made on its first use)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        return self._lock


def follow_loop(
    bound: asyncio.AbstractEventLoop | None, fd: int, reader: Callable[[], None]
) -> asyncio.AbstractEventLoop:
    """Have the running loop call ``reader`` when ``fd`` is readable, moving it from
    ``bound`` (the loop that did, None for none yet); returns the running loop. Without
    this, an executor's second loop would never read its cover watch (a covered name the
    host replaced would not stop the command) nor its spawn helper's answers."""
    loop = asyncio.get_running_loop()
    if bound is loop:
        return loop
    if bound is not None and not bound.is_closed():
        with contextlib.suppress(Exception):  # a loop already torn down drops its readers
            bound.remove_reader(fd)
    loop.add_reader(fd, reader)
    return loop
