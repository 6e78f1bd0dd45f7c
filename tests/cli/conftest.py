"""Fixtures for the CLI tests: a workspace and a private temp dir under ``tmp_path``.

Every executor makes its state directory under the temp dir; pointing the temp dir (in
process and for subprocesses) into ``tmp_path`` keeps each test's traces inside it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_probes import CliRunner


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("TMPDIR", str(path))
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return Path(os.path.realpath(path))


@pytest.fixture
def cli(private_tempdir: Path) -> Iterator[CliRunner]:
    """Runs `bash-sandbox` as a real subprocess; anything it leaves alive is killed by pid."""
    runner = CliRunner([sys.executable, "-m", "bash_sandbox.cli"],
                       env=dict(os.environ, TMPDIR=str(private_tempdir)))
    yield runner
    runner.kill_all()
