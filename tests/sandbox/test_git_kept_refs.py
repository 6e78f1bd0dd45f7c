"""The spawn snapshot's refs kept between spawns (`git_import/kept_refs.py`): every way a host
user or tool moves a ref between two commands is seen, checked against host git's own fresh
answer and by counting the `git for-each-ref` processes; and with the kept answer engaged, a
host commit between snapshot and import is still a conflict that overwrites nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bash_sandbox.git_import import kept_refs
from bash_sandbox.git_import.transaction import host_refs
from bash_sandbox.kept_answers import KeptAnswers
from bash_seam import GitImportStatus
from tests.sandbox.conftest import counted_git_runs
from tests.sandbox.git_import_harness import (
    Overlay,
    commits_on_both_sides,
    fsck_clean,
    host_git,
    make_repo,
    reachable,
)


@pytest.fixture
def kept(
    monkeypatch: pytest.MonkeyPatch,
) -> KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]]:
    # Files older than this window are trusted not to change unseen; a test's own writes are
    # fresh, so it narrows the window (and each change sleeps past a coarse clock's tick).
    answers: KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]] = KeptAnswers(racy_ns=0)
    monkeypatch.setattr(kept_refs, "_ANSWERS", answers)
    return answers


@pytest.fixture
def git_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    return counted_git_runs(monkeypatch, "for-each-ref")


def _settle() -> None:
    time.sleep(0.05)  # past a coarse filesystem clock's tick


def _edit_in_place(path: Path, text: str) -> None:
    """Rewrite a loose ref's bytes at the same size, then put its mtime back."""
    st = path.stat()
    with open(path, "r+") as fh:
        fh.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _host_changes(repo: Path) -> list[tuple[str, Callable[[], object]]]:
    def commit() -> None:
        (repo / "c.txt").write_text(str(time.time_ns()))
        host_git(repo, "add", "c.txt")
        host_git(repo, "commit", "-qm", "host")

    first = host_git(repo, "rev-parse", "main").strip()
    return [
        ("a commit moves the branch", commit),
        ("a new branch", lambda: host_git(repo, "branch", "side")),
        ("a branch in a new directory", lambda: host_git(repo, "branch", "topic/deep")),
        ("a tag", lambda: host_git(repo, "tag", "v1")),
        ("a branch deleted", lambda: host_git(repo, "branch", "-D", "side")),
        ("refs packed", lambda: host_git(repo, "pack-refs", "--all")),
        ("a packed ref moved", lambda: host_git(repo, "update-ref", "refs/tags/v1", first)),
        ("a packed ref deleted", lambda: host_git(repo, "branch", "-D", "topic/deep")),
        ("a remote ref", lambda: host_git(repo, "update-ref", "refs/remotes/o/main", first)),
        ("a ref file edited in place", lambda: _edit_in_place(
            repo / ".git" / "refs" / "remotes" / "o" / "main",
            host_git(repo, "rev-parse", "main").strip() + "\n",
        )),
    ]  # fmt: skip


def _loose_files(repo: Path) -> list[str]:
    refs = repo / ".git" / "refs"
    return sorted(str(p.relative_to(repo / ".git")) for p in refs.rglob("*") if p.is_file())


def test_every_host_ref_change_between_spawns_is_seen(
    tmp_path: Path,
    kept: KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]],
    git_runs: list[list[str]],
) -> None:
    repo = make_repo(tmp_path / "repo")
    gitdir = str(repo / ".git")
    _settle()
    assert kept_refs.snapshot_refs(gitdir)[0] == host_refs(gitdir)
    assert kept_refs.snapshot_refs(gitdir)[0] == host_refs(gitdir)
    asked = len(git_runs)
    assert asked == 3  # the second snapshot read the kept answer; host_refs asks every time
    for what, change in _host_changes(repo):
        change()
        _settle()
        snapshot, loose = kept_refs.snapshot_refs(gitdir)
        fresh = host_refs(gitdir)
        assert snapshot == fresh, what
        # The names that are loose files, which the import tells a host repack by.
        assert sorted(loose or ()) == _loose_files(repo), what
        assert len(git_runs) == asked + 2, f"{what}: not asked again"
        assert kept_refs.snapshot_refs(gitdir)[0] == fresh, what
        assert len(git_runs) == asked + 2, f"{what}: the new answer was not kept"
        asked = len(git_runs)


def test_a_ref_written_within_a_clock_tick_is_asked_again(
    tmp_path: Path,
    kept: KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]],
    git_runs: list[list[str]],
) -> None:
    repo = make_repo(tmp_path / "repo")
    kept.racy_ns = 2_000_000_000  # the repository was just written
    gitdir = str(repo / ".git")
    for _ in range(3):
        assert kept_refs.snapshot_refs(gitdir)[0] == host_refs(gitdir)
    assert len(git_runs) == 6
    assert len(kept) == 0


@pytest.mark.parametrize("layout", ["linked worktree", "reftable", "symlink below refs"])
def test_what_the_stamps_cannot_follow_is_asked_every_time(
    tmp_path: Path,
    kept: KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]],
    git_runs: list[list[str]],
    layout: str,
) -> None:
    repo = make_repo(tmp_path / "repo")
    gitdir = repo / ".git"
    if layout == "linked worktree":
        host_git(repo, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "wt")
        gitdir = gitdir / "worktrees" / "wt"
    elif layout == "reftable":
        (gitdir / "reftable").mkdir()  # present: git reads refs from its tables
    else:
        (gitdir / "refs" / "heads" / "linked").symlink_to(tmp_path)
    _settle()
    for _ in range(2):
        kept_refs.snapshot_refs(str(gitdir))
    assert len(git_runs) == 2
    assert len(kept) == 0


def test_with_a_kept_baseline_a_host_commit_before_the_import_overwrites_nothing(
    tmp_path: Path,
    kept: KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]],
    git_runs: list[list[str]],
) -> None:
    # The snapshot of this spawn comes from the answer an earlier spawn kept; the host then
    # commits while the command commits too: a conflict, both commits kept, the host's ref
    # the host's.
    repo = make_repo(tmp_path / "repo")
    _settle()
    kept_refs.snapshot_refs(str(repo / ".git"))
    ov = Overlay(repo, tmp_path / "state")
    assert len(git_runs) == 1  # the overlay's snapshot read the kept answer
    ours, theirs, outcome = commits_on_both_sides(ov, repo)
    assert outcome is not None and outcome.status is GitImportStatus.CONFLICT
    assert outcome.conflicts[0].name == "refs/heads/main"
    assert host_git(repo, "rev-parse", "main").strip() == theirs
    assert reachable(repo, ours)
    fsck_clean(repo)


def test_an_import_leaves_the_host_files_it_only_read_as_they_were(tmp_path: Path) -> None:
    # The import's view of the command's refs was built by linking the host's HEAD and loose
    # refs: each link changed their ctime, which the kept answers stamp (the hook chain's
    # HEAD, the snapshot's refs), so every import made the next spawns ask host git again.
    from bash_sandbox.git_import import import_changes, load_snapshot

    repo = make_repo(tmp_path / "repo")
    host_git(repo, "branch", "side")
    gitdir = repo / ".git"
    _settle()
    kept_refs.snapshot_refs(str(gitdir))
    read_only = [
        gitdir / "HEAD",
        gitdir / "refs" / "heads" / "main",
        gitdir / "refs" / "heads" / "side",
    ]
    before = {p: os.lstat(p) for p in read_only}
    ov = Overlay(repo, tmp_path / "state")
    ov.run("echo x > new.txt && git add new.txt")  # the index only: no ref moves
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    result = import_changes(snap)
    assert result.outcome is not None and result.outcome.status is GitImportStatus.APPLIED
    assert "new.txt" in host_git(repo, "ls-files")  # the import did land
    for path, st in before.items():
        now = os.lstat(path)
        assert (now.st_ino, now.st_nlink, now.st_ctime_ns) == (
            st.st_ino,
            st.st_nlink,
            st.st_ctime_ns,
        ), path
    fsck_clean(repo)
