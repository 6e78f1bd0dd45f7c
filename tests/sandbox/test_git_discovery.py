"""Which git directories get an overlay: what a writable root reaches, and nothing a
`.git` file merely names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bash_sandbox.git_plane import discover_gitdirs
from policies import SandboxPolicy


def _git(cwd: Path, *args: str) -> None:
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always",
         *args],
        cwd=cwd, env=env, check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def _policy(root: Path) -> SandboxPolicy:
    return SandboxPolicy(mode="workspace-write", workspace_root=str(root))


def test_repositories_are_found_at_any_depth_and_in_dependency_dirs(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    deep = "a/b/c/d/e/f/g/.git"
    for path in (".git", "lib/.git", deep, "node_modules/x/.git", ".venv/src/pkg/.git"):
        (ws / path).mkdir(parents=True)
    found = discover_gitdirs(_policy(ws))
    assert set(found.gitdirs) == {
        str(ws / p) for p in (".git", "lib/.git", deep, "node_modules/x/.git", ".venv/src/pkg/.git")
    }
    assert found.unsearched == () and found.partial == ()
    # Dependency directories come last: a small budget names them, not the workspace's own.
    small = discover_gitdirs(_policy(ws), budget=3)
    assert small.unsearched_total > 0
    assert any(str(ws / ".venv") in why or str(ws / "node_modules") in why for why in small.partial)


def test_a_git_file_naming_a_host_directory_gets_no_overlay(tmp_path: Path) -> None:
    ws, victim = tmp_path / "ws", tmp_path / "victim"
    (ws / "sub").mkdir(parents=True)
    (victim / "refs").mkdir(parents=True)
    (victim / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "sub" / ".git").write_text(f"gitdir: {victim}\n")
    # Even with a plausible back-pointer to somewhere else, or a commondir leading out.
    (victim / "gitdir").write_text(str(tmp_path / "elsewhere" / ".git") + "\n")
    assert discover_gitdirs(_policy(ws)).gitdirs == ()
    inside = ws / "planted-gitdir"
    inside.mkdir()
    (ws / "sub" / ".git").write_text(f"gitdir: {inside}\n")
    # A git dir the command planted inside the root may name any common dir: only one
    # inside the roots is taken, never `/`, the home or the victim above it.
    for common in (str(victim), "/", str(tmp_path), "../.."):
        (inside / "commondir").write_text(common + "\n")
        assert discover_gitdirs(_policy(ws)).gitdirs == (str(inside),), common


def test_linked_worktrees_and_submodules_point_back_and_are_overlaid(tmp_path: Path) -> None:
    main, origin = tmp_path / "main", tmp_path / "origin"
    for repo in (main, origin):
        repo.mkdir()
        _git(repo, "init", "-q")
        _git(repo, "commit", "-q", "--allow-empty", "-m", "first")
    _git(main, "worktree", "add", "-q", str(tmp_path / "linked"))
    _git(main, "submodule", "add", "-q", str(origin), "x")
    linked = discover_gitdirs(_policy(tmp_path / "linked")).gitdirs
    assert linked == (str(main / ".git"),)  # the worktree's own dir lies inside it
    submodule = discover_gitdirs(_policy(main / "x")).gitdirs
    assert submodule == (str(main / ".git" / "modules" / "x"),)
