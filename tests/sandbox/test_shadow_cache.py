"""The shadow survey is reused only while every directory it read is unchanged; whatever
changes, a secret never becomes readable and the next spawn sees the host as it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bash_sandbox.backends import shadow_cache
from bash_sandbox.backends.mount_plan import inspect_shadows
from bash_sandbox.backends.shadow_cache import ShadowCache

PAST = 1_600_000_000  # 2020: long settled
# pytest made the temp dirs' parents a moment ago: those would count as racy. The tests'
# own directories are set to PAST, so every change a test makes is a new mtime.
TRUST_ALL = -(10**18)


def _settle(*paths: Path) -> None:
    for p in paths:
        os.utime(p, (PAST, PAST), follow_symlinks=False)


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / ".netrc").write_text("machine x password hunter2\n")
    _settle(home, tmp_path)
    return home


def _entries(result: tuple[object, ...], directory: Path) -> dict[str, str]:
    shadows = result[0]
    for shadow in shadows:  # type: ignore[attr-defined]
        if shadow.directory == str(directory):
            return {e.name: e.kind for e in shadow.entries}
    raise AssertionError(f"{directory} is not shadowed")


def test_an_unchanged_host_reuses_the_survey_and_answers_the_same(tmp_path: Path) -> None:
    home = _home(tmp_path)
    denied = (str(home / ".netrc"), str(home / ".aws"))
    cache = ShadowCache(settle_ns=TRUST_ALL)
    first = cache.inspect(denied, ())
    second = cache.inspect(denied, ())
    assert cache.hits == 1
    assert first == second == inspect_shadows(denied, ())
    assert _entries(first, home) == {".netrc": "denied-file", "src": "dir"}


def test_a_secret_made_after_the_survey_is_hidden_at_the_next_spawn(tmp_path: Path) -> None:
    home = _home(tmp_path)
    denied = (str(home / ".netrc"), str(home / ".aws"))
    cache = ShadowCache(settle_ns=TRUST_ALL)
    assert ".aws" not in _entries(cache.inspect(denied, ()), home)
    assert ".aws" not in _entries(cache.inspect(denied, ()), home)
    assert cache.hits == 1  # held: the change below is what ends it
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("secret\n")
    result = cache.inspect(denied, ())
    assert cache.hits == 1
    assert _entries(result, home)[".aws"] == "denied-dir"


def test_a_new_sibling_shows_at_the_next_spawn(tmp_path: Path) -> None:
    home = _home(tmp_path)
    denied = (str(home / ".netrc"),)
    cache = ShadowCache(settle_ns=TRUST_ALL)
    cache.inspect(denied, ())
    cache.inspect(denied, ())
    assert cache.hits == 1
    (home / "newproject").mkdir()
    assert _entries(cache.inspect(denied, ()), home)["newproject"] == "dir"
    assert cache.hits == 1


def test_a_directory_changed_within_the_settle_window_is_never_trusted(tmp_path: Path) -> None:
    home = _home(tmp_path)
    (home / "just-now").write_text("")  # home's mtime is now: racy
    denied = (str(home / ".netrc"),)
    cache = ShadowCache()  # the real window: home changed a moment ago
    cache.inspect(denied, ())
    cache.inspect(denied, ())
    assert cache.hits == 0
    _settle(home)
    trusting = ShadowCache(settle_ns=TRUST_ALL)
    trusting.inspect(denied, ())
    trusting.inspect(denied, ())
    assert trusting.hits == 1


def test_a_retargeted_link_through_another_directory_is_followed_again(tmp_path: Path) -> None:
    # ~/.ssh -> hop/link -> data/ssh: the second hop lives in a directory that is neither an
    # ancestor of ~/.ssh nor of its first target, and still counts.
    home = _home(tmp_path)
    for name in ("data", "data2"):
        (tmp_path / name / "ssh").mkdir(parents=True)
        (tmp_path / name / "ssh" / "id_ed25519").write_text("key\n")
    hop = tmp_path / "hop"
    hop.mkdir()
    (hop / "link").symlink_to(tmp_path / "data" / "ssh")
    (home / ".ssh").symlink_to(hop / "link")
    _settle(home, hop, tmp_path, tmp_path / "data", tmp_path / "data2")
    denied = (str(home / ".ssh"),)
    cache = ShadowCache(settle_ns=TRUST_ALL)
    assert _entries(cache.inspect(denied, ()), tmp_path / "data")["ssh"] == "denied-dir"
    cache.inspect(denied, ())
    assert cache.hits == 1
    (hop / "link").unlink()
    (hop / "link").symlink_to(tmp_path / "data2" / "ssh")
    _settle(home, tmp_path)  # only hop/ changed
    result = cache.inspect(denied, ())
    assert cache.hits == 1
    assert _entries(result, tmp_path / "data2")["ssh"] == "denied-dir"


def test_a_seeded_survey_is_used_only_while_the_host_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warm daemon seeds one survey before its forks; each fork's fresh executor starts
    # from it and checks every stamp first, as between its own commands.
    monkeypatch.setattr(shadow_cache, "_seeded", None)
    home = _home(tmp_path)
    denied = (str(home / ".netrc"), str(home / ".aws"))
    assert shadow_cache.seed(denied, (), settle_ns=TRUST_ALL)
    fresh = ShadowCache(settle_ns=TRUST_ALL)
    assert fresh.inspect(denied, ()) == inspect_shadows(denied, ())
    assert fresh.hits == 1
    other_key = ShadowCache(settle_ns=TRUST_ALL)
    other_key.inspect(denied[:1], ())  # another policy's list: surveyed afresh
    assert other_key.hits == 0
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("secret\n")
    after = ShadowCache(settle_ns=TRUST_ALL)
    result = after.inspect(denied, ())
    assert after.hits == 0
    assert _entries(result, home)[".aws"] == "denied-dir"


def test_nothing_is_seeded_from_a_directory_changed_just_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shadow_cache, "_seeded", None)
    home = _home(tmp_path)
    (home / "just-now").write_text("")
    assert not shadow_cache.seed((str(home / ".netrc"),), ())
    assert ShadowCache()._survey is None
