"""`running_spawns`: which executors of this uid have had a command running over which roots,
across executors of one process and across processes (a file in the uid's fixed bases)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bash_sandbox import running_spawns


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(running_spawns, "fixed_bases", lambda: (str(tmp_path),))
    monkeypatch.setattr(running_spawns, "_ended", {})
    monkeypatch.setattr(running_spawns, "_last_file", {})
    monkeypatch.setattr(running_spawns, "_swept", {})
    return tmp_path


def _running(base: Path) -> list[str]:
    return [n for n in os.listdir(base / "running") if not n.startswith("ended:")]


def test_another_executors_command_over_a_parent_or_a_child_root_is_seen(base: Path) -> None:
    since = time.time_ns()
    token = running_spawns.begin(1, ("/w/ws",))
    try:
        assert running_spawns.others_over(2, ("/w/ws/sub",), since)  # a root inside it
        assert running_spawns.others_over(2, ("/w",), since)  # a root holding it
        assert not running_spawns.others_over(2, ("/w/other",), since)
        assert not running_spawns.others_over(1, ("/w/ws",), since)  # its own executor's
    finally:
        running_spawns.end(token)
    assert _running(base) == []
    # Ended after the survey began reading: it may have planted and settled meanwhile.
    assert running_spawns.others_over(2, ("/w/ws",), since)
    # Ended before: nothing of it is left to be read.
    assert not running_spawns.others_over(2, ("/w/ws",), time.time_ns())


def test_another_process_is_seen_while_it_runs_and_after_it_ended_since_the_reading(
    base: Path,
) -> None:
    code = (
        "import sys; from bash_sandbox import running_spawns as r;"
        f" r.fixed_bases = lambda: ({str(base)!r},); t = r.begin(1, ('/w/ws',));"
        " print('up', flush=True); sys.stdin.readline(); r.end(t);"
        " print('ended', flush=True); sys.stdin.read()"
    )
    since = time.time_ns()
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == b"up\n"
        assert running_spawns.others_over(1, ("/w/ws",), since)  # another process's owner 1
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"ended\n"
        assert running_spawns.others_over(1, ("/w/ws",), since)  # ended since the reading
        assert not running_spawns.others_over(1, ("/w/ws",), time.time_ns())
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_killed_processes_record_is_dropped(base: Path) -> None:
    code = (
        "import sys; from bash_sandbox import running_spawns as r;"
        f" r.fixed_bases = lambda: ({str(base)!r},); r.begin(1, ('/w/ws',));"
        " print('up', flush=True); sys.stdin.read()"  # killed: never ends its record
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert running_spawns.others_over(1, ("/w/ws",), time.time_ns())
    finally:
        child.kill()
        child.wait(timeout=30)
    assert not running_spawns.others_over(1, ("/w/ws",), time.time_ns())
    assert os.listdir(base / "running") == []  # swept


def test_ended_records_older_than_a_minute_are_swept(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without it, every workspace-write spawn left one file behind, forever.
    for root in ("/w/a", "/w/b", "/w/c"):
        running_spawns.end(running_spawns.begin(1, (root,)))
    assert len(os.listdir(base / "running")) == 3  # the last minute's
    monkeypatch.setattr(running_spawns, "_KEEP_NS", 0)
    monkeypatch.setattr(running_spawns, "_SWEEP_NS", 0)
    running_spawns.end(running_spawns.begin(1, ("/w/ws",)))
    assert len(os.listdir(base / "running")) <= 1  # only the one just ended, if that


def test_a_run_of_commands_over_the_same_roots_leaves_one_record_that_still_answers(
    base: Path,
) -> None:
    # Each end listed the directory, which held the minute's hundreds at a harness's pace.
    since = time.time_ns()
    for _ in range(50):
        running_spawns.end(running_spawns.begin(1, ("/w/ws",)))
    assert len(os.listdir(base / "running")) == 1
    # The latest end answers every reading the earlier ones did (seen from another process,
    # which has only the file).
    probe = (
        "import sys; from bash_sandbox import running_spawns as r;"
        f"r.fixed_bases = lambda: ({str(base)!r},);"
        f"sys.exit(0 if r.others_over(2, ('/w/ws/sub',), {since}) else 1)"
    )
    assert subprocess.run([sys.executable, "-c", probe], check=False, timeout=60).returncode == 0
