"""Fixtures for the CLI tests: a workspace, a private temp dir and a user config dir.

Every executor makes its state directory under the temp dir; pointing the temp dir (in
process and for subprocesses) into ``tmp_path`` keeps each test's traces inside it. The
user config dir (`XDG_CONFIG_HOME`) is the test's own too, so the host's
`~/.config/bash-sandbox/config.toml` never changes what a test runs.
"""

from __future__ import annotations

import os
import signal
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


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`$XDG_CONFIG_HOME` of the test (0700, like a home's); the user config goes in
    ``config_home / "bash-sandbox" / "config.toml"``."""
    path = tmp_path / "config"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path))
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return Path(os.path.realpath(path))


@pytest.fixture
def cli(private_tempdir: Path, config_home: Path) -> Iterator[CliRunner]:
    """Runs `bash-sandbox` as a real subprocess; anything it leaves alive is killed by pid."""
    runner = CliRunner(
        [sys.executable, "-m", "bash_sandbox.cli"],
        env=dict(os.environ, TMPDIR=str(private_tempdir), XDG_CONFIG_HOME=str(config_home)),
    )
    yield runner
    runner.kill_all()


# A run started as a background job or under nohup (as CI may be) ignores SIGINT, and an
# ignored signal stays ignored across exec: the CLIs these tests start would never see it.
# A handler (not SIG_IGN) here resets to the default in every child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _sig in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, signal.SIG_DFL)
