"""A few workflows through `bash-sandbox run` as a real process, limits flags included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workflows.conftest import Workflow


def cli(flow: Workflow, *args: str, config_home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TMPDIR=str(flow.executor_tmp), XDG_CONFIG_HOME=str(config_home))
    argv = [sys.executable, "-m", "bash_sandbox.cli", "run", "--backend", flow.backend]
    return subprocess.run(
        [*argv, "--workspace", str(flow.root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def config_home(tmp_path: Path) -> Path:
    path = tmp_path / "config"  # empty: no user config
    path.mkdir(mode=0o700)
    return path


def first_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return f"exit {done.returncode}; stderr: {lines[:1]} ... {lines[-1:]}"


async def test_pytest_through_the_cli_in_read_only(
    python_workflow: Workflow, config_home: Path
) -> None:
    done = cli(
        python_workflow,
        "--",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 .venv/bin/python -m pytest -q",
        config_home=config_home,
    )
    assert done.returncode == 0, first_error(done)
    assert "3 passed" in done.stdout
    await python_workflow.finish()


async def test_make_through_the_cli_in_workspace_write(
    c_workflow: Workflow, config_home: Path
) -> None:
    done = cli(
        c_workflow, "--mode", "workspace-write", "--", "make -s && ./hello", config_home=config_home
    )
    assert done.returncode == 0, first_error(done)
    assert done.stdout == "hello from c\n"
    await c_workflow.finish(["hello"])


async def test_npm_test_through_the_cli(node_workflow: Workflow, config_home: Path) -> None:
    done = cli(node_workflow, "--", "npm test", config_home=config_home)
    assert done.returncode == 0, first_error(done)
    assert "node test ok" in done.stdout
    await node_workflow.finish()


async def test_limit_flags_are_enforced(plain_workflow: Workflow, config_home: Path) -> None:
    done = cli(
        plain_workflow,
        "--mode",
        "workspace-write",
        "--max-open-files",
        "64",
        "--tmp-size",
        "1M",
        "--",
        "ulimit -n; head -c 3M /dev/zero > /tmp/big && echo tmp-not-limited || echo tmp-full",
        config_home=config_home,
    )
    assert done.stdout.splitlines() == ["64", "tmp-full"], first_error(done)
    await plain_workflow.finish()
