"""Fixtures for the local executor's tests: a fast-grace executor and outside-view process checks.

Everything here runs real processes, only under ``tmp_path``, and kills what it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from local_probes import GRACE_MS, is_alive

from bash_local import LocalBashExecutor
from bash_seam import BashExecRequest, BashExecSpec


@pytest.fixture
def spawned_pids() -> Iterator[list[int]]:
    """Pids a test learned about; any still alive at teardown are SIGKILLed (by pid)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def spill_parent(tmp_path: Path) -> Path:
    path = tmp_path / "spill"
    path.mkdir()
    return path


@pytest.fixture
async def executor(tmp_path: Path, spill_parent: Path) -> AsyncIterator[LocalBashExecutor]:
    ex = LocalBashExecutor(
        cwd=str(tmp_path), grace_ms=GRACE_MS, timeout_ms=20_000, spill_dir=str(spill_parent)
    )
    yield ex
    await ex.aclose()


@pytest.fixture
def spec(executor: LocalBashExecutor) -> Callable[..., BashExecSpec]:
    """``spec("echo hi", timeout_ms=100)``: resolve a request on the test executor."""

    def make(command: str, **fields: Any) -> BashExecSpec:
        return executor.resolve(BashExecRequest(command=command, **fields))

    return make
