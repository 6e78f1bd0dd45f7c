"""Host helper processes (git) run to completion within a time bound.

`subprocess.run(..., timeout=...)` waits for the process's exit by polling (`waitpid` with
WNOHANG, then sleeps of 0.5 ms, 1 ms, 2 ms...): the process has closed its pipes but not yet
exited when the first look comes, so nearly every call sleeps: 1.1 ms on top of the 1.3
ms a small `git` takes here, and a spawn in a repository, its import and its settle run up
to twenty of them. Here the wait is a plain blocking one, and the bound is kept by one
watchdog thread for every run of the process, which kills a run's group (it runs in a
session of its own) at its deadline: the same result, the same `TimeoutExpired`. (A timer
thread per run cost its start, a wait for the new thread to be scheduled: 0.4-0.5 ms of
each git here, 6 ms of an import's fourteen.)
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence


class _Bound:
    """One run's deadline: ``kill`` is called once if it passes before the run is done."""

    __slots__ = ("done", "expired", "kill")

    def __init__(self, kill: Callable[[], None]) -> None:
        self.kill = kill
        self.done = False
        self.expired = False


class _Watchdog:
    """The process's one thread that ends runs at their deadlines (started on first use)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Empty, with no thread: in a fork (the warm daemon's calls) the thread is not
        there, and its copy of the lock may have been held by it."""
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, _Bound]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, timeout: float, kill: Callable[[], None]) -> _Bound:
        bound = _Bound(kill)
        with self._cond:
            heapq.heappush(self._due, (time.monotonic() + timeout, next(self._order), bound))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="bash-sandbox-host-run", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify()
        return bound

    def finish(self, bound: _Bound) -> None:
        """The run is over: its deadline passes without a kill (under the lock, so an
        expiry is either complete or never starts)."""
        with self._cond:
            bound.done = True

    def _serve(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._due and (self._due[0][2].done or self._due[0][0] <= now):
                    _, _, bound = heapq.heappop(self._due)
                    if not bound.done:
                        bound.expired = bound.done = True
                        bound.kill()
                self._cond.wait(self._due[0][0] - now if self._due else None)


_watchdog = _Watchdog()
os.register_at_fork(after_in_child=_watchdog.reset)


def run_bounded(
    argv: Sequence[str],
    *,
    timeout: float,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """`subprocess.run(argv, input=..., capture_output=True, timeout=...)`, with stdin from
    /dev/null when there is no input (nothing of the caller's is read)."""
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
    ) as proc:

        def kill_group() -> None:
            # The whole group: a child it started (git's index-pack) holds the pipes too.
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

        bound = _watchdog.watch(timeout, kill_group)
        try:
            stdout, stderr = proc.communicate(input)
        except BaseException:
            kill_group()
            raise
        finally:
            _watchdog.finish(bound)
    if bound.expired:
        raise subprocess.TimeoutExpired(list(argv), timeout, stdout, stderr)
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
