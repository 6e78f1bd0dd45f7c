"""Which paths get read-only mounts: protected names (existing, missing, symlinked), hidden."""

from __future__ import annotations

import os
from pathlib import Path

from bash_sandbox.backends.mount_plan import (
    PathTarget,
    PlaceholderSources,
    PlannedMount,
    inspect_deny_read,
    inspect_protected,
    make_placeholder_sources,
    render_mount_plan,
    symlinked_protected_paths,
)
from policies import SandboxPolicy

SOURCES = PlaceholderSources("/s/empty", "/s/denied-dir", "/s/denied-file")


def _policy(ws: Path, **kw: object) -> SandboxPolicy:
    return SandboxPolicy(mode="workspace-write", workspace_root=str(ws), deny_read=(), **kw)  # type: ignore[arg-type]


def test_missing_git_protects_the_first_missing_component(tmp_path: Path) -> None:
    targets = inspect_protected(_policy(tmp_path))
    assert set(targets) == {PathTarget(str(tmp_path / ".git"), "protect-missing")}


def test_existing_and_missing_names_under_an_existing_git(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    targets = inspect_protected(_policy(tmp_path))
    assert set(targets) == {
        PathTarget(str(tmp_path / ".git"), "pin"),
        PathTarget(str(tmp_path / ".git" / "hooks"), "protect-missing"),
        PathTarget(str(tmp_path / ".git" / "config"), "protect-existing"),
    }


def test_symlinked_protected_name_protects_its_target_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / ".git" / "hooks")
    os.symlink(tmp_path / "planted-config", tmp_path / ".git" / "config")  # dangling
    targets = set(inspect_protected(_policy(tmp_path)))
    assert PathTarget(str(tmp_path / "elsewhere"), "protect-existing") in targets
    assert PathTarget(str(tmp_path / "planted-config"), "protect-missing") in targets
    # The directory holding the links is pinned so it cannot be renamed away...
    assert PathTarget(str(tmp_path / ".git"), "pin") in targets
    # ...but the links themselves cannot be mounted over: that is reported as partial.
    assert symlinked_protected_paths(_policy(tmp_path)) == (
        str(tmp_path / ".git" / "hooks"),
        str(tmp_path / ".git" / "config"),
    )


def test_symlink_leaving_every_root_needs_no_mount(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    os.symlink(tmp_path, ws / ".git" / "hooks")
    os.symlink(tmp_path / "cfg", ws / ".git" / "config")
    assert inspect_protected(_policy(ws)) == (PathTarget(str(ws / ".git"), "pin"),) * 2


def test_read_only_mode_protects_nothing(tmp_path: Path) -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root=str(tmp_path), deny_read=())
    assert inspect_protected(policy) == ()


def test_deny_read_covers_existing_paths_and_symlink_targets(tmp_path: Path) -> None:
    (tmp_path / "real-ssh").mkdir()
    os.symlink(tmp_path / "real-ssh", tmp_path / ".ssh")
    (tmp_path / ".netrc").write_text("machine x")
    targets = inspect_deny_read(
        (str(tmp_path / ".ssh"), str(tmp_path / ".netrc"), str(tmp_path / "absent"))
    )
    assert set(targets) == {
        PathTarget(str(tmp_path / "real-ssh"), "hide-dir"),
        PathTarget(str(tmp_path / ".netrc"), "hide-file"),
    }


def test_render_orders_protections_first_and_drops_nested_targets() -> None:
    protected = (
        PathTarget("/w/.git/hooks", "protect-missing"),
        PathTarget("/w/.git", "protect-missing"),
    )
    hidden = (
        PathTarget("/h/.ssh/id", "hide-file"),
        PathTarget("/h/.ssh", "hide-dir"),
        PathTarget("/h/.netrc", "hide-file"),
    )
    assert render_mount_plan(protected, hidden, SOURCES) == (
        PlannedMount("/s/empty", "/w/.git", create=True),
        PlannedMount("/s/denied-file", "/h/.netrc"),
        PlannedMount("/s/denied-dir", "/h/.ssh"),
    )


def test_placeholder_sources_have_exact_modes(tmp_path: Path) -> None:
    sources = make_placeholder_sources(str(tmp_path))
    assert os.stat(sources.empty_dir).st_mode & 0o7777 == 0o555
    assert os.stat(sources.deny_dir).st_mode & 0o7777 == 0
    assert os.stat(sources.deny_file).st_mode & 0o7777 == 0
    os.chmod(sources.deny_dir, 0o700)
