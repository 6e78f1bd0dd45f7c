"""Outside views of processes for the local tests: is a pid alive, wait for it to die.

Named apart from conftest so test modules import it unambiguously next to other suites.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

GRACE_MS = 200


def is_alive(pid: int) -> bool:
    """Seen from outside: does ``pid`` still run? A zombie counts as dead (init may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): fall back to a null signal
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def wait_dead(pid: int, timeout: float = 5.0) -> None:
    """Poll until ``pid`` is gone; killed processes take a moment to disappear."""
    deadline = time.monotonic() + timeout
    while is_alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} is still alive")
        time.sleep(0.01)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition produced by another process (a file appearing, a line printed)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def pids_in(text: str) -> list[int]:
    return [int(word) for word in text.split() if word.isdigit()]
