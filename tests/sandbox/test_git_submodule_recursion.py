"""Host git in the parent repository recurses into a submodule path that a running command
populates: a known limit (README, Known limits), recorded here as a strict xfail. Real bwrap
and Landlock; judged by the marker the command's planted fsmonitor would make."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory
from tests.sandbox.git_import_harness import GIT_ENV, host_git, make_repo


@pytest.mark.xfail(
    strict=True,
    reason="a repository the command creates is reset only after the command ends; while a "
    "start()ed command runs, host `git status` in the parent recurses into a gitlink path "
    "holding it (an existing submodule, initialised or not, or one the command's pull "
    "brought) and obeys its config. No import rule can tell this gitlink from a pulled one, "
    "and holding the path refuses `git submodule update --init`",
)
async def test_host_git_in_the_parent_never_runs_a_submodule_a_running_command_populates(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The user's clone of a project with a submodule it never initialised.
    repo = make_repo(workspace / "repo")
    head = host_git(repo, "rev-parse", "HEAD").strip()
    host_git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},sub")
    (repo / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n\turl = ./sub\n')
    host_git(repo, "add", ".gitmodules")
    host_git(repo, "commit", "-qm", "submodule")
    marker, ready, go = tmp_path / "pwned", workspace / "ready", workspace / "go"
    ex = make_executor(mode="workspace-write")
    spec = ex.resolve(
        BashExecRequest(
            command=f"git init -q sub && git -C sub config core.fsmonitor 'touch {marker}; :'"
            f" && touch {ready} && for i in $(seq 400); do [ -e {go} ] && break; sleep 0.05; done",
            workdir=str(repo),
            env=GIT_ENV,
        )
    )
    process = await ex.start(spec)
    try:
        for _ in range(400):
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        assert ready.exists()
        host_git(repo, "status", "--short", check=False)  # the user's, or an editor's poll
        assert not marker.exists()
    finally:
        go.touch()
        await asyncio.wait_for(process.wait(), 30)
