"""`running_spawns`: which executors of this uid have a command running over which roots,
across executors of one process and across processes (a file in the uid's fixed bases)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bash_sandbox import running_spawns


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(running_spawns, "fixed_bases", lambda: (str(tmp_path),))
    return tmp_path


def test_another_executors_command_over_a_parent_or_a_child_root_is_seen(base: Path) -> None:
    token = running_spawns.begin(1, ("/w/ws",))
    try:
        assert running_spawns.others_over(2, ("/w/ws/sub",))  # a root inside it
        assert running_spawns.others_over(2, ("/w",))  # a root holding it
        assert not running_spawns.others_over(2, ("/w/other",))
        assert not running_spawns.others_over(1, ("/w/ws",))  # its own executor's
    finally:
        running_spawns.end(token)
    assert not running_spawns.others_over(2, ("/w/ws",))
    assert os.listdir(base / "running") == ["generation"]


def test_another_process_is_seen_until_it_ends_and_a_dead_ones_record_is_dropped(
    base: Path,
) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from bash_sandbox import running_spawns as r;"
            f" r.fixed_bases = lambda: ({str(base)!r},); r.begin(1, ('/w/ws',));"
            " print('up', flush=True); sys.stdin.read()",  # killed: never ends its record
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert running_spawns.others_over(1, ("/w/ws",))  # another process: its owner ids differ
        child.kill()
        child.wait(timeout=30)
        assert not running_spawns.others_over(1, ("/w/ws",))
        assert os.listdir(base / "running") == ["generation"]  # the dead one's record swept
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


def test_the_generation_moves_with_every_record_made_or_removed(base: Path) -> None:
    before = running_spawns.generation()
    token = running_spawns.begin(1, ("/w/ws",))
    during = running_spawns.generation()
    running_spawns.end(token)
    after = running_spawns.generation()
    assert before != during != after != before
    assert running_spawns.generation() == after  # asked again: nothing moved
