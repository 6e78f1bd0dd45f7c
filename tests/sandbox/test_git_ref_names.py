"""A ref the command makes under a name host git would read as HEAD or a pseudo ref, or as a
branch name git refuses: never imported (host git warned "refname 'HEAD' is ambiguous" on
every command after it), its commit kept under the keep namespace. Real bwrap and Landlock;
every check made with host git from outside."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bash_seam import BashExecRequest, BashRunResult, GitImportStatus
from tests.sandbox.conftest import ExecutorFactory
from tests.sandbox.git_import_harness import GIT_ENV, fsck_clean, host_git, make_repo


def _stderr(repo: Path, *args: str) -> str:
    """What host git says on stderr (`host_git` returns stdout only)."""
    done = subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stderr


async def _run(ex: object, command: str, cwd: Path) -> BashRunResult:
    spec = ex.resolve(BashExecRequest(command=command, workdir=str(cwd), env=GIT_ENV))  # type: ignore[attr-defined]
    result: BashRunResult = await ex.run(spec)  # type: ignore[attr-defined]
    return result


@pytest.mark.parametrize("ref", ["refs/heads/HEAD", "refs/tags/HEAD", "refs/heads/-x"])
async def test_a_ref_host_git_would_misread_is_not_imported_and_its_commit_is_kept(
    ref: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    start = host_git(repo, "rev-parse", "main").strip()
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        f"c=$(git commit-tree -p HEAD -m made HEAD^{{tree}}) && git update-ref {ref} $c",
        repo,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None and result.sandbox.git, result.sandbox
    outcome = result.sandbox.git[0]
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    named = [d for d in result.sandbox.denials if d.target.endswith(ref)]
    assert named and "git" in named[0].reason, result.sandbox.denials
    assert host_git(repo, "for-each-ref", "--format=%(refname)", ref) == ""
    assert "ambiguous" not in _stderr(repo, "rev-parse", "HEAD")
    assert host_git(repo, "rev-parse", "main").strip() == start
    kept = host_git(repo, "rev-parse", f"{outcome.kept_at}/{ref.removeprefix('refs/')}").strip()
    assert host_git(repo, "log", "-1", "--format=%s", kept).strip() == "made"
    fsck_clean(repo)


async def test_an_ordinary_branch_and_tag_are_still_imported(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "git branch feature/HEAD-fix && git tag v1-HEAD", repo)
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None and result.sandbox.git, result.sandbox
    assert result.sandbox.git[0].status is GitImportStatus.APPLIED, result.sandbox.git
    refs = host_git(repo, "for-each-ref", "--format=%(refname)").split()
    assert {"refs/heads/feature/HEAD-fix", "refs/tags/v1-HEAD"} <= set(refs)
    fsck_clean(repo)
