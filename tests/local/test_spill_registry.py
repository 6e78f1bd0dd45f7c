"""The registry of custom spill parents (`userdir.register_spill_parent`): read before every
confined spawn, so parents that are gone are dropped, and never a registration with them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bash_local import userdir


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private per-user base for this test (never the real one)."""
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    monkeypatch.setattr(userdir, "user_base_dir", lambda: str(base))
    return base


def _lines(base: Path) -> list[str]:
    return (base / "spill-dirs").read_text().splitlines()


def test_parents_that_are_gone_are_dropped_from_the_registry(base: Path, tmp_path: Path) -> None:
    parents = [tmp_path / f"spill-{n}" for n in range(4)]
    for parent in parents:
        parent.mkdir()
        userdir.register_spill_parent(str(parent))
    assert _lines(base) == [str(p) for p in parents]
    parents[0].rmdir()
    parents[2].rmdir()
    live = [str(parents[1]), str(parents[3])]
    assert userdir.registered_spill_parents() == tuple(live)
    assert _lines(base) == live  # the file itself no longer names them
    # A parent made again at a dropped path is one once an executor registers it again.
    parents[0].mkdir()
    assert str(parents[0]) not in userdir.registered_spill_parents()
    userdir.register_spill_parent(str(parents[0]))
    assert userdir.registered_spill_parents() == (*live, str(parents[0]))


def test_no_registration_is_lost_to_a_concurrent_prune(base: Path, tmp_path: Path) -> None:
    registered: list[str] = []

    def register(count: int) -> None:
        for n in range(count):
            parent = tmp_path / f"live-{n}"
            parent.mkdir()
            userdir.register_spill_parent(str(parent))
            registered.append(str(parent))

    gone = tmp_path / "gone"
    writer = threading.Thread(target=register, args=(60,))
    writer.start()
    try:
        for _ in range(200):  # bounded: every pass has a dead entry to prune
            gone.mkdir()
            userdir.register_spill_parent(str(gone))
            gone.rmdir()
            userdir.registered_spill_parents()
    finally:
        writer.join()
    assert set(registered) <= set(userdir.registered_spill_parents())
    assert set(_lines(base)) == set(registered)
