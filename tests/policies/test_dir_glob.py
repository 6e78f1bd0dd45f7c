"""The deny patterns' glob answers are reused only while their directory is unchanged."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pytest

from policies import dir_glob, policy


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = glob.glob

    def counting(pattern: str, **kw: bool) -> list[str]:
        calls.append(pattern)
        return real(pattern, **kw)

    monkeypatch.setattr(dir_glob.glob, "glob", counting)
    monkeypatch.setattr(dir_glob, "_kept", {})
    return calls


def test_an_unchanged_directory_is_listed_once(
    tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dir_glob, "SETTLE_NS", 0)
    (tmp_path / ".aider.conf.yml").write_text("x")
    (tmp_path / ".aiderignore").write_text("x")
    (tmp_path / "other").write_text("x")
    time.sleep(0.01)
    pattern = f"{tmp_path}/.aider*"
    first = dir_glob.expand(pattern)
    assert first == (f"{tmp_path}/.aider.conf.yml", f"{tmp_path}/.aiderignore")
    assert dir_glob.expand(pattern) == first
    assert counted == [pattern]


@pytest.mark.parametrize("change", ["create", "remove", "rename", "create then restore mtime"])
def test_a_changed_directory_is_listed_again(
    tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    monkeypatch.setattr(dir_glob, "SETTLE_NS", 0)
    (tmp_path / ".aider.a").write_text("x")
    time.sleep(0.01)
    pattern = f"{tmp_path}/.aider*"
    assert dir_glob.expand(pattern) == (f"{tmp_path}/.aider.a",)
    before = os.stat(tmp_path)
    if change == "create":
        (tmp_path / ".aider.b").write_text("x")
    elif change == "remove":
        (tmp_path / ".aider.a").unlink()
    elif change == "rename":
        (tmp_path / ".aider.a").rename(tmp_path / "plain")
    else:
        # The same mtime put back (a tool preserving times, or two changes in one tick):
        # the ctime still moved, so the stamp still differs.
        (tmp_path / ".aider.b").write_text("x")
        os.utime(tmp_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    expected = sorted(str(p) for p in tmp_path.iterdir() if p.name.startswith(".aider"))
    assert list(dir_glob.expand(pattern)) == expected
    assert len(counted) == 2


def test_a_recent_directory_is_never_kept(tmp_path: Path, counted: list[str]) -> None:
    (tmp_path / ".aider.a").write_text("x")
    pattern = f"{tmp_path}/.aider*"
    for _ in range(3):
        assert dir_glob.expand(pattern) == (f"{tmp_path}/.aider.a",)
    assert len(counted) == 3  # changed within the settle window: listed every time
    old = time.time() - 60
    os.utime(tmp_path, (old, old))  # an old mtime alone does not settle it: the ctime is now
    dir_glob.expand(pattern)
    assert len(counted) == 4


def test_the_default_deny_list_sees_a_new_store_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dir_glob, "SETTLE_NS", 0)
    monkeypatch.setattr(dir_glob, "_kept", {})
    time.sleep(0.01)
    assert f"{tmp_path}/.aider.oauth-keys.env" not in policy.default_deny_read(str(tmp_path))
    (tmp_path / ".aider.oauth-keys.env").write_text("KEY=x\n")
    assert f"{tmp_path}/.aider.oauth-keys.env" in policy.default_deny_read(str(tmp_path))
