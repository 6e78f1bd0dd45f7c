"""Fixtures for real-kernel tests of the Linux backends.

A backend is skipped only when its probe says it is unusable AND we are not in CI: in CI a
missing backend fails, so the suite can never pass by skipping everything.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.backends.base import BackendProbe

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
