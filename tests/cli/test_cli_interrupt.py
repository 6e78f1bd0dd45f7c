"""Ctrl-C and friends: a signal to `bash-sandbox run` kills the command's whole group.

The CLI runs as a real process; the command backgrounds a `sleep` and waits. The test
signals the CLI by pid and checks from outside that the sleep is gone. A confined command
lives in its own PID namespace, so the `$!` it writes is a namespace pid: the host pid is
found by the sleep's unique argv (and, unconfined, must equal the pidfile's).
"""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path

import pytest
from cli_probes import (
    HAS_BWRAP,
    HAS_LANDLOCK,
    CliRunner,
    host_pids_with_argv,
    is_alive,
    kill_if_alive,
    wait_until,
)

_unique = itertools.count(1)


def _sleep_seconds() -> str:
    # A duration nobody else on the host uses, so its argv identifies our sleep.
    return f"30.{os.getpid()}{next(_unique):03d}"


@pytest.mark.parametrize(("mode", "backend", "sig", "expected"), [
    pytest.param("workspace-write", "auto", signal.SIGINT, 130,
                 marks=pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK),
                                          reason="no sandbox backend")),
    pytest.param("workspace-write", "landlock", signal.SIGINT, 130,
                 marks=[pytest.mark.landlock,
                        pytest.mark.skipif(not HAS_LANDLOCK, reason="no Landlock")]),
    pytest.param("workspace-write", "auto", signal.SIGTERM, 143,
                 marks=pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK),
                                          reason="no sandbox backend")),
    pytest.param("danger-full-access", "auto", signal.SIGINT, 130),
])
def test_signal_to_the_cli_kills_the_command_group(
    mode: str, backend: str, sig: signal.Signals, expected: int,
    cli: CliRunner, workspace: Path,
) -> None:
    seconds = _sleep_seconds()
    pidfile = workspace / "pidfile"
    proc = cli.start("run", "--mode", mode, "--backend", backend, "--workspace",
                     str(workspace), "--", f"sleep {seconds} & echo $! > pidfile; wait")
    sleep_pids: list[int] = []
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "",
                   timeout=20, what="pidfile written")
        wait_until(lambda: bool(host_pids_with_argv(["sleep", seconds])),
                   timeout=10, what="sleep visible on the host")
        sleep_pids = host_pids_with_argv(["sleep", seconds])
        if mode == "danger-full-access":
            assert sleep_pids == [int(pidfile.read_text())]

        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=20)

        assert proc.returncode == expected
        assert f"{sig.name}: the command's process group was killed".encode() in err
        for pid in sleep_pids:
            wait_until(lambda pid=pid: not is_alive(pid), timeout=10,
                       what=f"sleep pid {pid} gone")
    finally:
        kill_if_alive(proc.pid)
        for pid in sleep_pids:
            kill_if_alive(pid)
