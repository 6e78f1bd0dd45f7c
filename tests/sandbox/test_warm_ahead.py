"""`SandboxBashExecutor.warm`: a spawn's read-only preparation ahead of its first spawn.

The warm CLI's spare runs it for a workspace-write call before the call comes. It must make
nothing the host sees, and what it caches must not outlive the host's changes: each test
checks the workspace from outside, and changes the host between the warm-up and the spawn.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bash_sandbox.git_import import fan_out
from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry below ``root`` with its mode, size and mtime: what the host sees."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            st = os.lstat(os.path.join(top, name))
            found[os.path.relpath(os.path.join(top, name), root)] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
            )
    return found


def _ahead(ex: object, workspace: Path) -> None:
    request = BashExecRequest(
        command="true", workdir=str(workspace), sandbox_mode="workspace-write"
    )
    ex.warm(ex.resolve(request))  # type: ignore[attr-defined]


async def test_warming_makes_nothing_the_host_sees(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    # The fan-out a first workspace-write spawn makes once (git's empty `objects/xx`
    # directories, so the host's objects show in the command's overlay), made ahead.
    fan_out(str(workspace / ".git"))
    (workspace / "src.txt").write_text("x\n")
    before = _tree(workspace)
    ex = make_executor(mode="workspace-write", protected_paths=(".git/hooks", ".envrc"))
    _ahead(ex, workspace)
    # No placeholder for the missing protected names, no overlay, no import intent.
    assert _tree(workspace) == before
    assert not (workspace / ".envrc").exists()
    # The spawn that follows still covers them, and leaves the workspace as it found it.
    result = await ex.run(
        ex.resolve(BashExecRequest(command="echo evil > .envrc; echo ok", workdir=str(workspace)))
    )
    assert result.stdout.text == "ok\n"
    assert not (workspace / ".envrc").exists()
    assert _tree(workspace) == before


async def test_a_secret_made_after_warming_is_still_hidden(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    later = secrets / "token"
    ex = make_executor(mode="workspace-write", deny_read=(str(later),))
    _ahead(ex, workspace)
    later.write_text("TOKEN-271828\n")  # the host makes it after the survey was warmed
    result = await ex.run(
        ex.resolve(BashExecRequest(command=f"cat {later}", workdir=str(workspace)))
    )
    assert "TOKEN-271828" not in result.stdout.text + result.stderr.text
    assert result.exit_code != 0
