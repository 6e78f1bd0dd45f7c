"""Fixtures for real-kernel tests of the Linux backends.

A backend is skipped only when its probe says it is unusable AND we are not in CI: in CI a
missing backend fails, so the suite can never pass by skipping everything.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bash_local import ExecutorClosedError
from bash_sandbox import SandboxBashExecutor
from bash_sandbox.backends.base import BackendProbe
from bash_seam import BashRunResult

LINUX_BACKENDS = ("bwrap", "landlock")


@functools.cache
def probe(name: str) -> BackendProbe:
    from bash_sandbox.backends.bwrap import BwrapBackend
    from bash_sandbox.backends.landlock import LandlockBackend

    backend = BwrapBackend() if name == "bwrap" else LandlockBackend()
    return backend.probe(10_000)


def require_backend(name: str) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux backends need Linux")
    result = probe(name)
    if not result.usable:
        if os.environ.get("CI"):
            pytest.fail(f"{name} must be usable in CI: {result.detail}")
        pytest.skip(f"{name} unusable here: {result.detail}")


@pytest.fixture(params=LINUX_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


ExecutorFactory = Callable[..., SandboxBashExecutor]


@pytest.fixture
async def make_executor(backend: str, workspace: Path) -> AsyncIterator[ExecutorFactory]:
    """Executors bound to the parametrised backend and the test's workspace; closed after."""
    made: list[SandboxBashExecutor] = []

    def factory(**kw: Any) -> SandboxBashExecutor:
        kw.setdefault("backend", backend)
        kw.setdefault("workspace_root", str(workspace))
        kw.setdefault("grace_ms", 500)
        ex = SandboxBashExecutor(**kw)
        made.append(ex)
        return ex

    yield factory
    for ex in made:
        await ex.aclose()


@contextlib.contextmanager
def private_tmpfs(path: Path, size: str = "64m") -> Iterator[Path]:
    """A tmpfs of this test's own at ``path`` (another filesystem than the test's tmp, or a
    small one to fill), unmounted after. Skips where no tmpfs can be mounted."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr!r}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def private_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own per-user base (the placeholder ledger, the spill registry lives
    there), for it and its children: nothing it records reaches the machine's executors."""
    path = tmp_path / "base"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("TMPDIR", str(path))
    return path


def counted_git_runs(monkeypatch: pytest.MonkeyPatch, word: str) -> list[list[str]]:
    """The argv of every process started with ``word`` in it from now on (git questions a
    module asks, through `subprocess.run` or `host_run.run_bounded`: both make a `Popen`;
    the module is shared, so counted by what is asked)."""
    runs: list[list[str]] = []

    class Counted(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, argv: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(argv, list | tuple) and word in argv:
                runs.append(list(argv))
            super().__init__(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Counted)
    return runs


def processes_naming(marker: str) -> set[int]:
    """Live processes whose command line holds ``marker`` (zombies and the gone excluded):
    what a test started, found by an argument unique to it."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.add(int(entry))
    return found


def sleep_token() -> str:
    """A `sleep` argument (about 30 s) unique to the calling test: `processes_naming` finds
    its commands by it. Digits only: `sleep` refuses a hex digit, and a sleep that fails at
    once would make every "nothing is left running" check pass unearned."""
    return f"30.{os.getpid() % 1000:03d}{int.from_bytes(os.urandom(3), 'big'):08d}"


def assert_closed_or_killed(outcomes: list[object]) -> None:
    """Each outcome of runs `aclose()` overtook: refused as closed (never a host problem: no
    `SandboxUnavailableError`, no raw OSError from the state the close removed), or a
    result the close killed; never a hang (the caller bounds the wait)."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, ExecutorClosedError), repr(outcome)
        else:
            assert isinstance(outcome, BashRunResult) and outcome.exit_code != 0, outcome
