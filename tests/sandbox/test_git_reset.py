"""The host-side pieces, without a sandbox: a created repository's reset never follows a
link the command left, keeps only data keys, and the cached search sees every change."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bash_sandbox.git_created import parse_config, reset_control_plane, serialize_config
from bash_sandbox.git_discovery import find_dotgits, index_gitlinks


def _git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, env=env, check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip


def test_the_reset_keeps_data_keys_and_drops_everything_else(tmp_path: Path) -> None:
    repo = tmp_path / "ws" / "x"
    repo.mkdir(parents=True)
    _git("init", "-q", cwd=repo)
    config = repo / ".git" / "config"
    with config.open("a") as fh:
        fh.write(
            '[remote "origin"]\n\turl = https://example.invalid/a.git\n'
            "\tfetch = +refs/heads/*:refs/remotes/origin/*\n\tuploadpack = touch x\n"
            '[remote "evil"]\n\turl = ext::sh -c touch% x\n'
            '[branch "main"]\n\tremote = origin\n\tmerge = refs/heads/main\n'
            "[core]\n\tfsmonitor = touch x\n\tsshCommand = touch x\n\tpager = touch x\n"
            '[filter "f"]\n\tclean = touch x\n[alias]\n\tst = !touch x\n'
            "[include]\n\tpath = /etc/passwd\n[user]\n\temail = a@b\n"
            '[credential]\n\thelper = !touch x\n[diff "d"]\n\ttextconv = touch x\n'
        )
    dropped = reset_control_plane(str(repo / ".git"), (str(tmp_path / "ws"),))
    assert any(d.startswith("config (") and "core.fsmonitor" in d for d in dropped)
    keys = {k for k, _ in parse_config(config.read_bytes()) or []}
    assert keys == {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "remote.origin.url",
        "remote.origin.fetch",
        "branch.main.remote",
        "branch.main.merge",
        "user.email",
    }
    # What git reads back is what was kept, value for value (quotes, backslashes survive).
    pairs = [("user.name", 'a "b" \\ c\td'), ("remote.we ird.url", "/p")]
    assert parse_config(serialize_config(pairs)) == pairs


def test_the_reset_never_follows_a_link_the_command_left(tmp_path: Path) -> None:
    ws, victim = tmp_path / "ws", tmp_path / "victim"
    (victim / "hooks").mkdir(parents=True)
    (victim / "hooks" / "keep").write_text("host\n")
    (victim / "config").write_text("[core]\n\tfsmonitor = host-owned\n")
    gitdir = ws / "x" / ".git"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    os.symlink(victim / "config", gitdir / "config")
    os.symlink(victim / "hooks", gitdir / "hooks")
    os.symlink(victim, gitdir / "info")
    reset_control_plane(str(gitdir), (str(ws),))
    assert (victim / "config").read_text() == "[core]\n\tfsmonitor = host-owned\n"
    assert (victim / "hooks" / "keep").read_text() == "host\n"
    assert not (gitdir / "config").is_symlink() and (gitdir / "config").read_bytes() == b""
    # A config git cannot parse is not left for a later git to half-read.
    (gitdir / "config").write_text("[core\n\tfsmonitor = x\n")
    assert "config (not a config git reads)" in reset_control_plane(str(gitdir), (str(ws),))
    assert (gitdir / "config").read_bytes() == b""
    assert (gitdir / "hooks").is_dir() and not (gitdir / "hooks").is_symlink()
    # A path through a symlinked parent is refused outright.
    os.symlink(victim, ws / "link")
    assert reset_control_plane(str(ws / "link"), (str(ws),)) == []
    assert (victim / "config").exists()


def test_a_cached_search_sees_a_repository_made_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bash_sandbox import git_discovery

    monkeypatch.setattr(git_discovery, "_RACY_NS", -(10**12))  # cache every listing
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    assert find_dotgits((str(ws),)) == ([], [])
    assert str(ws / "a" / "b") in git_discovery._LISTINGS
    old = time.time() - 10
    (ws / "a" / "b" / ".git").mkdir()
    # A command setting the mtime back cannot set the ctime back.
    os.utime(ws / "a" / "b", (old, old))
    assert find_dotgits((str(ws),)) == ([str(ws / "a" / "b" / ".git")], [])


def test_a_cached_search_sees_a_head_rewritten_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bash_sandbox import git_discovery

    monkeypatch.setattr(git_discovery, "_RACY_NS", -(10**12))  # cache every listing
    ws = tmp_path / "ws"
    (ws / "x" / "objects").mkdir(parents=True)
    (ws / "x" / "refs").mkdir()
    (ws / "x" / "HEAD").write_text("not a ref\n")
    assert find_dotgits((str(ws),)) == ([], [])
    # The same inode rewritten: the directory's ctime stays, and x is a bare repository now.
    with open(ws / "x" / "HEAD", "r+") as fh:
        fh.write("ref: refs/heads/main\n")
    assert find_dotgits((str(ws),)) == ([str(ws / "x")], [])


def test_gitlinks_are_read_from_an_index_of_any_version(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("commit", "-q", "--allow-empty", "-m", "x", cwd=repo)
    head = _git("rev-parse", "HEAD", cwd=repo).strip()
    _git("update-index", "--index-version", "4", cwd=repo)
    _git("update-index", "--add", "--cacheinfo", f"160000,{head},deep/er/lib", cwd=repo)
    index = repo / ".git" / "index"
    assert index.read_bytes()[4:8] == b"\0\0\0\x04"
    assert index_gitlinks(str(index), str(repo / ".git")) == {"deep/er/lib"}


def test_bare_repositories_are_found_but_never_in_an_executors_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bash_sandbox import git_discovery

    ws = tmp_path / "ws"
    (ws / "fixtures").mkdir(parents=True)
    _git("init", "-q", "--bare", str(ws / "fixtures" / "remote.git"), cwd=tmp_path)
    # An overlay's upper layer holds git's layout too; the executors' state is not the user's.
    upper = ws / "state" / "git" / "1" / "upper"
    for name in ("objects", "refs"):
        (upper / name).mkdir(parents=True)
    (upper / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "not-a-repo" / "objects").mkdir(parents=True)
    (ws / "not-a-repo" / "refs").mkdir()
    (ws / "not-a-repo" / "HEAD").write_text("a file named HEAD\n")
    monkeypatch.setattr(git_discovery, "executor_dirs", lambda: frozenset({str(ws / "state")}))
    assert find_dotgits((str(ws),)) == ([str(ws / "fixtures" / "remote.git")], [])
