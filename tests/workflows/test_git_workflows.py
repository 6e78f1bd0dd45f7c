"""git inside the workspace: everyday history operations, checked with host git afterwards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.workflows.conftest import Workflow
from tests.workflows.workspaces import describe, git_host

# git writes its object store, refs, index and logs, and the files it checks out.
GIT_WRITES = (".git/*", "README.md", "topic.txt", "main.txt")


def _committed(root: Path) -> bool:
    return git_host(root, "log", "-1", "--format=%s").strip() == "edit readme"


def _branched(root: Path) -> bool:
    return git_host(root, "rev-parse", "--abbrev-ref", "HEAD").strip() == "feature"


def _stashed(root: Path) -> bool:
    stashes = git_host(root, "stash", "list").splitlines()
    return len(stashes) == 1 and (root / "README.md").read_text() == "# demo\n"


def _rebased(root: Path) -> bool:
    git_host(root, "merge-base", "--is-ancestor", "main", "topic")  # raises if not
    return git_host(root, "rev-parse", "--abbrev-ref", "HEAD").strip() == "topic"


def _worktree_added(root: Path) -> bool:
    listed = git_host(root, "worktree", "list", "--porcelain")
    return (root / "wt-feature" / "README.md").is_file() and "wt-feature" in listed


CASES: dict[str, tuple[str, Callable[[Path], bool], tuple[str, ...]]] = {
    "commit": ("echo more >> README.md && git commit -qam 'edit readme'", _committed, ()),
    "branch": ("git branch feature && git switch -q feature", _branched, ()),
    "stash": ("echo wip >> README.md && git stash -q && git stash list", _stashed, ()),
    "rebase": ("git switch -q topic && git rebase -q main", _rebased, ()),
    "worktree": ("git worktree add -q -b feature-wt wt-feature", _worktree_added, ("wt-feature*",)),
}


@pytest.mark.parametrize("operation", list(CASES))
async def test_git_operation_in_workspace_write(operation: str, git_workflow: Workflow) -> None:
    command, landed, extra_writes = CASES[operation]
    ex = git_workflow.executor("workspace-write")
    result = await git_workflow.sh(ex, command)
    assert result.exit_code == 0, describe(result)
    assert landed(git_workflow.root), f"host git does not see the {operation}"
    await git_workflow.finish((*GIT_WRITES, *extra_writes))


async def test_git_status_and_log_work_in_read_only(git_workflow: Workflow) -> None:
    ex = git_workflow.executor("read-only")
    result = await git_workflow.sh(ex, "git status --short --branch && git log --oneline -3")
    assert result.exit_code == 0, describe(result)
    assert result.stdout.text.startswith("## main\n")
    assert "main work" in result.stdout.text
    await git_workflow.finish()


async def test_read_only_git_status_with_a_stale_index_reports_no_denial(
    git_workflow: Workflow,
) -> None:
    # A file touched since the index was written: git would refresh the index (index.lock),
    # a refused write reported after a status that worked, pointing at workspace-write.
    import os
    import time

    readme = git_workflow.root / "README.md"
    later = time.time() + 5
    os.utime(readme, (later, later))
    ex = git_workflow.executor("read-only")
    result = await git_workflow.sh(ex, "git status --short")
    assert result.exit_code == 0, describe(result)
    assert result.sandbox is not None
    assert result.sandbox.denials == () and not result.sandbox.denied, result.sandbox.denials
    assert "[sandbox" not in result.stderr.text
    await git_workflow.finish(("README.md",))  # the test's own touch
