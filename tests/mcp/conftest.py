"""Fixtures for the MCP server tests: a workspace, a private temp dir, a server launcher.

Every server runs as a real process (`python -m bash_sandbox.cli mcp`) spoken to over a real
stdio pipe by the SDK's own client. The temp dir (in process and for the server) points into
``tmp_path`` so each test's executor state and spill files stay inside it. A sandbox backend
must be usable: skipped where none is, failed in CI.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_probes import ServerLauncher

from bash_sandbox.backends.base import BackendProbe


@functools.cache
def _probe(name: str) -> BackendProbe:
    from bash_sandbox.backends.bwrap import BwrapBackend
    from bash_sandbox.backends.landlock import LandlockBackend

    backend = BwrapBackend() if name == "bwrap" else LandlockBackend()
    return backend.probe(10_000)


def _require_backend() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("the MCP server tests use the Linux backends")
    probes = [_probe("bwrap"), _probe("landlock")]
    if not any(p.usable for p in probes):
        detail = "; ".join(f"{p.backend}: {p.detail}" for p in probes)
        if os.environ.get("CI"):
            pytest.fail(f"a sandbox backend must be usable in CI: {detail}")
        pytest.skip(f"no sandbox backend usable here: {detail}")


@pytest.fixture(scope="session", autouse=True)
def sandbox_backend() -> None:
    _require_backend()


@pytest.fixture(params=["bwrap", "landlock"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each Linux backend in turn, for the tests that must hold on both."""
    name: str = request.param
    probe = _probe(name)
    if not probe.usable:
        if os.environ.get("CI"):
            pytest.fail(f"{name} must be usable in CI: {probe.detail}")
        pytest.skip(f"{name} unusable here: {probe.detail}")
    return name


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
def outside(tmp_path: Path) -> Path:
    """A directory outside every writable root: where a session log may live."""
    path = tmp_path / "state"
    path.mkdir()
    return Path(os.path.realpath(path))


@pytest.fixture
def launcher(private_tempdir: Path, workspace: Path) -> ServerLauncher:
    return ServerLauncher(workspace, env=dict(os.environ, TMPDIR=str(private_tempdir)))


# A run started in the background (as CI may be) ignores SIGINT, and an ignored signal stays
# ignored across exec: the servers these tests signal would never see it. A handler (not
# SIG_IGN) here resets to the default in every child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _sig in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _kill_raw_servers(launcher: ServerLauncher) -> Iterator[None]:
    yield
    launcher.kill_all()
