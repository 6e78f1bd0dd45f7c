"""`host_run.run_bounded`: `subprocess.run` with output captured and a time bound, without
its exit polling. Checked on real processes: what they read and wrote, their exit status,
and, past the bound, that the process is gone (its pid no longer names it)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bash_sandbox.host_run import run_bounded


def test_output_status_and_an_empty_stdin() -> None:
    done = run_bounded(
        ["sh", "-c", "cat; echo out; echo err >&2; exit 3"], timeout=30, cwd="/", env={}
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")


def test_large_input_and_output_pass_whole() -> None:
    data = os.urandom(4 << 20)  # more than any pipe holds: written while it is read
    script = "import sys; d = sys.stdin.buffer.read(); sys.stdout.buffer.write(d[::-1])"
    done = run_bounded([sys.executable, "-c", script], input=data, timeout=60)
    assert done.returncode == 0
    assert done.stdout == data[::-1]


def test_past_the_bound_the_process_is_killed_and_timeout_expired_raised(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_bounded(["sh", "-c", f"echo $$ > {pid_file}; echo partial; exec sleep 30"], timeout=0.5)
    assert time.monotonic() - started < 10
    assert caught.value.timeout == 0.5
    assert caught.value.output == b"partial\n"
    pid = int(pid_file.read_text())
    # Reaped: the pid names no process of ours any more (or a new, unrelated one).
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            assert b"sleep" not in fh.read()
    except FileNotFoundError:
        pass


def test_past_the_bound_a_child_holding_the_pipes_is_killed_too(tmp_path: Path) -> None:
    """A grandchild that keeps the output pipes open (as git's index-pack would) neither
    stretches the bound nor survives it."""
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], timeout=0.5)
    assert time.monotonic() - started < 10
    pid = int(pid_file.read_text())
    for _ in range(200):  # killed with the group; reaped by init, soon
        try:
            with open(f"/proc/{pid}/stat") as fh:
                name, state = fh.read().split("(", 1)[1].rsplit(")", 1)
        except FileNotFoundError:
            break
        if name != "sleep" or state.split()[0] == "Z":
            break  # gone (the pid names another process now), or dead
        time.sleep(0.01)
    else:
        raise AssertionError(f"the grandchild {pid} still runs")


def test_a_missing_program_raises_as_subprocess_does() -> None:
    with pytest.raises(FileNotFoundError):
        run_bounded(["/nonexistent/bash-sandbox-no-such-program"], timeout=5)


def test_bounds_of_runs_at_once_are_kept_each_by_one_watchdog(tmp_path: Path) -> None:
    # One watchdog for every run: runs from several threads, the short bounds among long
    # ones, each killed at its own deadline while the others finish.
    results: dict[int, str] = {}

    def one(i: int) -> None:
        bound = 0.4 if i % 2 else 30.0
        try:
            done = run_bounded(
                ["sh", "-c", f"sleep {0.05 if bound > 1 else 30}; echo {i}"], timeout=bound
            )
            results[i] = done.stdout.decode().strip()
        except subprocess.TimeoutExpired:
            results[i] = "expired"

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert time.monotonic() - started < 10
    assert results == {i: ("expired" if i % 2 else str(i)) for i in range(8)}
    names = [t.name for t in threading.enumerate() if t.name == "bash-sandbox-host-run"]
    assert names == ["bash-sandbox-host-run"]


def test_a_fork_keeps_its_own_bounds() -> None:
    # The warm daemon forks its calls: the child has no watchdog thread of the parent's.
    run_bounded(["true"], timeout=30)  # the parent's watchdog is running
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through its status)
        code = 1
        try:
            run_bounded(["sleep", "30"], timeout=0.3)
        except subprocess.TimeoutExpired:
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the fork's bounded run was never ended")
