"""`git_hook_chain.host_config` keeps host git's answer until a file it depends on changes.

Real git on real repositories; each change is one a host user makes between two commands,
and the next answer must be git's own again: a stale one would leave a newly configured hooks
directory or include uncovered. Counted from outside: how many git processes ran.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_sandbox import git_hook_chain
from bash_sandbox.kept_answers import KeptAnswers
from tests.sandbox.conftest import counted_git_runs


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    # Files older than this window are trusted not to change unseen; a test's own writes
    # are fresh, so it narrows the window (and sleeps past a coarse clock's tick).
    monkeypatch.setattr(git_hook_chain, "_ANSWERS", KeptAnswers(racy_ns=0))
    time.sleep(0.05)
    yield work


@pytest.fixture
def git_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    return counted_git_runs(monkeypatch, "--show-origin")  # host_config's question


def changed(path: Path, text: str) -> None:
    """A host user's edit, then past the coarse clock's tick."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    time.sleep(0.05)


def answer(work: Path) -> git_hook_chain.HostConfig:
    return git_hook_chain.host_config(str(work / ".git"))


def test_an_unchanged_repository_asks_git_once(repo: Path, git_runs: list[list[str]]) -> None:
    first = answer(repo)
    assert first.hooks == str(repo / ".git" / "hooks")
    assert answer(repo) == first and answer(repo) == first
    assert len(git_runs) == 1


def test_a_config_edit_is_seen(repo: Path, git_runs: list[list[str]]) -> None:
    answer(repo)
    config = repo / ".git" / "config"
    changed(config, config.read_text() + "[core]\n\thooksPath = .githooks\n")
    assert answer(repo).hooks == str(repo / ".githooks")
    assert len(git_runs) == 2


def test_an_include_that_appears_later_is_seen(repo: Path, git_runs: list[list[str]]) -> None:
    config = repo / ".git" / "config"
    changed(config, config.read_text() + "[include]\n\tpath = ../shared.gitconfig\n")
    before = answer(repo)
    assert before.hooks == str(repo / ".git" / "hooks")
    assert answer(repo) == before and len(git_runs) == 1
    changed(repo / "shared.gitconfig", "[core]\n\thooksPath = planted\n")
    after = answer(repo)
    assert after.hooks == str(repo / "planted")
    assert str(repo / "shared.gitconfig") in after.files
    assert len(git_runs) == 2


def test_a_branch_switch_is_seen_by_onbranch_includes(
    repo: Path, git_runs: list[list[str]]
) -> None:
    config = repo / ".git" / "config"
    changed(repo / "feature.gitconfig", "[core]\n\thooksPath = feature-hooks\n")
    changed(
        config,
        config.read_text() + '[includeIf "onbranch:feature"]\n\tpath = ../feature.gitconfig\n',
    )
    assert answer(repo).hooks == str(repo / ".git" / "hooks")
    subprocess.run(
        ["git", "-C", str(repo), "symbolic-ref", "HEAD", "refs/heads/feature"], check=True
    )
    time.sleep(0.05)
    assert answer(repo).hooks == str(repo / "feature-hooks")
    assert len(git_runs) == 2


@pytest.mark.parametrize("where", [".gitconfig", ".config/git/config"])
def test_a_global_config_made_later_is_seen(
    repo: Path, git_runs: list[list[str]], where: str
) -> None:
    answer(repo)
    changed(Path(os.environ["HOME"], where), "[core]\n\thooksPath = /srv/hooks\n")
    assert answer(repo).hooks == "/srv/hooks"
    assert len(git_runs) == 2


def test_a_freshly_written_config_is_asked_again(
    repo: Path, git_runs: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Within a clock tick of git's read, a later write could keep every stamp: not kept.
    monkeypatch.setattr(git_hook_chain._ANSWERS, "racy_ns", 2_000_000_000)
    config = repo / ".git" / "config"
    config.write_text(config.read_text() + "[core]\n\thooksPath = fresh\n")
    assert answer(repo).hooks == str(repo / "fresh")
    assert answer(repo).hooks == str(repo / "fresh")
    assert len(git_runs) == 2


def test_a_same_size_edit_with_its_mtime_put_back_is_seen(
    repo: Path, git_runs: list[list[str]]
) -> None:
    # Same inode, same size, mtime restored: only the ctime, which no process sets, tells.
    config = repo / ".git" / "config"
    changed(config, config.read_text() + "[core]\n\thooksPath = aaaaaa\n")
    assert answer(repo).hooks == str(repo / "aaaaaa")
    before = config.stat()
    with config.open("r+") as fh:
        text = fh.read()
        fh.seek(0)
        fh.write(text.replace("aaaaaa", "bbbbbb"))
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = config.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert answer(repo).hooks == str(repo / "bbbbbb")
    assert len(git_runs) == 2
