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

from bash_sandbox.cli import main

_unique = itertools.count(1)


def _sleep_seconds() -> str:
    # A duration nobody else on the host uses, so its argv identifies our sleep.
    return f"30.{os.getpid()}{next(_unique):03d}"


@pytest.mark.parametrize(
    ("mode", "backend", "sig", "expected"),
    [
        pytest.param(
            "workspace-write",
            "auto",
            signal.SIGINT,
            130,
            id="sigint-auto",
            marks=pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend"),
        ),
        pytest.param(
            "workspace-write",
            "landlock",
            signal.SIGINT,
            130,
            id="sigint-landlock",
            marks=[
                pytest.mark.landlock,
                pytest.mark.skipif(not HAS_LANDLOCK, reason="no Landlock"),
            ],
        ),
        pytest.param(
            "workspace-write",
            "auto",
            signal.SIGTERM,
            143,
            id="sigterm-auto",
            marks=pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend"),
        ),
        pytest.param("danger-full-access", "auto", signal.SIGINT, 130, id="sigint-unconfined"),
    ],
)
def test_signal_to_the_cli_kills_the_command_group(
    mode: str,
    backend: str,
    sig: signal.Signals,
    expected: int,
    cli: CliRunner,
    workspace: Path,
) -> None:
    seconds = _sleep_seconds()
    pidfile = workspace / "pidfile"
    proc = cli.start(
        "run",
        "--mode",
        mode,
        "--backend",
        backend,
        "--workspace",
        str(workspace),
        "--",
        f"sleep {seconds} & echo $! > pidfile; wait",
    )
    sleep_pids: list[int] = []
    try:
        wait_until(
            lambda: pidfile.exists() and pidfile.read_text().strip() != "",
            timeout=20,
            what="pidfile written",
        )
        wait_until(
            lambda: bool(host_pids_with_argv(["sleep", seconds])),
            timeout=10,
            what="sleep visible on the host",
        )
        sleep_pids = host_pids_with_argv(["sleep", seconds])
        if mode == "danger-full-access":
            assert sleep_pids == [int(pidfile.read_text())]

        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=20)

        assert proc.returncode == expected
        assert f"{sig.name}: the command's process group was killed".encode() in err
        for pid in sleep_pids:
            wait_until(lambda pid=pid: not is_alive(pid), timeout=10, what=f"sleep pid {pid} gone")
    finally:
        kill_if_alive(proc.pid)
        for pid in sleep_pids:
            kill_if_alive(pid)


# What nohup does: SIGHUP ignored, and the ignore survives exec.
IGNORING_SIGHUP = ("/bin/sh", "-c", "trap '' HUP; exec \"$@\"", "sh")


@pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")
def test_an_inherited_ignored_sighup_stays_ignored_like_under_nohup(
    cli: CliRunner, workspace: Path
) -> None:
    proc = cli.start(
        "run",
        "--mode",
        "workspace-write",
        "--workspace",
        str(workspace),
        "--",
        "touch ready; until [ -e go ]; do sleep 0.01; done; echo finished",
        wrapper=IGNORING_SIGHUP,
    )
    try:
        wait_until((workspace / "ready").exists, timeout=20, what="command started")
        os.kill(proc.pid, signal.SIGHUP)
        (workspace / "go").touch()
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert out == b"finished\n"
    finally:
        kill_if_alive(proc.pid)


@pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")
def test_in_process_run_restores_the_callers_signal_handlers(workspace: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not expected to be called")

    before = signal.signal(signal.SIGTERM, mine)
    try:
        sigint = signal.getsignal(signal.SIGINT)
        assert main(["run", "--workspace", str(workspace), "--", "true"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is sigint
    finally:
        signal.signal(signal.SIGTERM, before)
