"""`policies.autorun.home_paths` keeps its answer with the kind of every path it looked at:
after any change a user or a command makes to a home, the kept answer is the one a fresh
walk gives (`_home_paths`, uncached), and a layout with a link is walked every time."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from policies import autorun

_NAMES = (".config", ".config/git", ".local", ".ssh", ".cargo", ".vimrc", ".bashrc", "bin", "go")


def _fresh(roots: tuple[str, ...]) -> list[autorun.Found]:
    found, _ = autorun._home_paths(roots, (), {})
    return found


def _change(rng: random.Random, home: Path, dotfiles: Path) -> None:
    target = home / rng.choice(_NAMES)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    elif target.parent.is_dir():
        step = rng.randrange(3)
        if step == 0:
            target.mkdir()
        elif step == 1:
            target.write_text("x")
        else:  # a dotfiles manager's link into the root
            linked = dotfiles / target.name.lstrip(".")
            linked.mkdir(exist_ok=True)
            target.symlink_to(linked)


@pytest.mark.parametrize("seed", range(10))
def test_the_kept_answer_follows_every_change_to_a_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    home = tmp_path / "home"
    dotfiles = home / "dotfiles"
    dotfiles.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(autorun, "_KEPT", {})
    rng = random.Random(seed)
    for roots in ((str(home),), (str(dotfiles),)):  # the home, or a root inside it
        for _ in range(10):
            assert autorun.home_paths(roots) == _fresh(roots)
            assert autorun.home_paths(roots) == _fresh(roots)  # the kept one, if kept
            _change(rng, home, dotfiles)


def test_an_answer_that_followed_a_link_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "dotfiles" / "ssh").mkdir(parents=True)
    (home / ".ssh").symlink_to(home / "dotfiles" / "ssh")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(autorun, "_KEPT", {})
    roots = (str(home / "dotfiles"),)
    first = autorun.home_paths(roots)
    assert any(p.startswith(str(home / "dotfiles" / "ssh")) for p, _ in first)
    assert autorun._KEPT == {}
    # The link re-pointed (same kind at every path): a kept answer would miss it.
    (home / "dotfiles" / "ssh2").mkdir()
    os.unlink(home / ".ssh")
    (home / ".ssh").symlink_to(home / "dotfiles" / "ssh2")
    assert any(p.startswith(str(home / "dotfiles" / "ssh2")) for p, _ in autorun.home_paths(roots))
