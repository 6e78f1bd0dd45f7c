"""Host helper processes (git) run to completion within a time bound.

`subprocess.run(..., timeout=...)` waits for the process's exit by polling (`waitpid` with
WNOHANG, then sleeps of 0.5 ms, 1 ms, 2 ms...): the process has closed its pipes but not yet
exited when the first look comes, so nearly every call sleeps: 1.1 ms on top of the 1.3
ms a small `git` takes here, and a spawn in a repository, its import and its settle run up
to twenty of them. Here the wait is a plain blocking one, and the bound is
a timer that kills the process's group (it runs in a session of its own): the same result,
the same `TimeoutExpired`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence


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
    expired = threading.Event()
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

        def expire() -> None:
            expired.set()
            kill_group()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            stdout, stderr = proc.communicate(input)
        except BaseException:
            kill_group()
            raise
        finally:
            timer.cancel()
    if expired.is_set():
        raise subprocess.TimeoutExpired(list(argv), timeout, stdout, stderr)
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
