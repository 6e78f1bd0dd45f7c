"""The record of spill parents (`userdir.register_spill_parent`), kept in this uid's fixed
bases: read before every confined spawn, so parents that are gone are dropped, and never a
registration with them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bash_local import userdir


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private fixed base for this test (never the real one), its per-user base too."""
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    monkeypatch.setattr(userdir, "user_base_dir", lambda: str(base))
    monkeypatch.setattr(userdir, "fixed_bases", lambda: (str(base),))
    return base


def _lines(base: Path) -> list[str]:
    """The record's paths (each ended by a NUL, as the filesystem's bytes)."""
    data = (base / "spill-parents").read_bytes()
    assert data.endswith(b"\0"), data
    return [os.fsdecode(r) for r in data.split(b"\0")[:-1]]


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


def test_a_parent_whose_path_holds_a_newline_or_bytes_not_utf8_is_named_exactly(
    base: Path, tmp_path: Path
) -> None:
    # One path a line split a parent named with a newline in two (neither hidden, so a
    # confined command could read the spill files there), and one with bytes that are not
    # UTF-8 failed to register at all. Each is now recorded as its own bytes.
    odd = [
        tmp_path / "spill\nsecond",
        Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/spill-\xff")),
        tmp_path / "plain",
    ]
    for parent in odd:
        parent.mkdir()
        userdir.register_spill_parent(str(parent))
    assert userdir.registered_spill_parents() == tuple(str(p) for p in odd)
    odd[1].rmdir()  # a prune rewrites them as they are
    assert userdir.registered_spill_parents() == (str(odd[0]), str(odd[2]))
    assert _lines(base) == [str(odd[0]), str(odd[2])]


def test_a_registry_written_one_path_a_line_is_still_read(base: Path, tmp_path: Path) -> None:
    older = [tmp_path / "a", tmp_path / "b"]
    for parent in older:
        parent.mkdir()
    (base / "spill-parents").write_bytes(b"".join(os.fsencode(p) + b"\n" for p in older))
    assert userdir.registered_spill_parents() == tuple(str(p) for p in older)
    newer = tmp_path / "c"
    newer.mkdir()
    userdir.register_spill_parent(str(newer))  # appended after the old lines: read as one
    assert str(newer) in userdir.registered_spill_parents()


def test_a_record_cut_short_is_never_read_as_a_path_nor_joined_to_the_next(
    base: Path, tmp_path: Path
) -> None:
    # A kill or a full disk within an append leaves a record without its NUL: read as it
    # is, `/x/sp` names some other directory, and the next record joined to it names none.
    whole, cut, later = tmp_path / "whole", tmp_path / "sp", tmp_path / "spill-later"
    for parent in (whole, cut, later):
        parent.mkdir()
    (base / "spill-parents").write_bytes(os.fsencode(whole) + b"\0" + os.fsencode(cut))
    assert userdir.registered_spill_parents() == (str(whole),)
    assert userdir.recorded_spill_parents() == (str(whole),)
    userdir.register_spill_parent(str(later))
    assert _lines(base) == [str(whole), str(later)]
    # The first record alone cut short: no NUL at all, and no newline a legacy file ends with.
    (base / "spill-parents").write_bytes(os.fsencode(cut))
    assert userdir.recorded_spill_parents() == ()
    userdir.register_spill_parent(str(later))
    assert _lines(base) == [str(later)]


def test_a_parent_stays_recorded_when_the_base_that_recorded_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Recorded in the registering base's own registry, a custom parent was forgotten when a
    # /tmp cleaner or a reboot removed that base (its spill files stay, on purpose).
    fixed = [tmp_path / "tmp-fixed", tmp_path / "var-tmp-fixed"]
    for f in fixed:
        f.mkdir(mode=0o700)
    monkeypatch.setattr(userdir, "fixed_bases", lambda: tuple(map(str, fixed)))
    other = tmp_path / "other-tmpdir" / "bash-sandbox-0"
    other.mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(userdir, "user_base_dir", lambda: str(other))
    parent = tmp_path / "spill-a"
    parent.mkdir()
    userdir.register_spill_parent(str(parent))
    # The default parent of a base that is not a fixed one is recorded too.
    default = userdir.default_spill_parent()
    assert default == str(other / "spill")
    (other / "spill" / "kept").mkdir()  # a spill dir with its files, kept on purpose
    for f in fixed:
        names = (f / "spill-parents").read_bytes().split(b"\0")[:-1]
        assert names == [os.fsencode(parent), os.fsencode(default)]
    fixed[0].joinpath("spill-parents").unlink()  # /tmp's record cleaned: /var/tmp's stays
    monkeypatch.setattr(userdir, "user_base_dir", lambda: str(tmp_path / "fresh"))
    assert set(userdir.recorded_spill_parents()) == {str(parent), default}


def test_the_parents_recorded_per_base_before_are_merged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = tmp_path / "fixed"
    fixed.mkdir(mode=0o700)
    monkeypatch.setattr(userdir, "fixed_bases", lambda: (str(fixed),))
    old_base = tmp_path / "old-tmpdir" / "bash-sandbox-0"
    (old_base / "spill").mkdir(parents=True)
    custom = tmp_path / "custom"
    custom.mkdir()
    (old_base / "spill-dirs").write_bytes(os.fsencode(custom) + b"\0")
    userdir._merge_legacy_registries((str(old_base),))
    assert set(userdir.registered_spill_parents()) == {str(custom), str(old_base / "spill")}
    (fixed / "spill-parents").write_bytes(b"")
    userdir._merge_legacy_registries((str(old_base),))  # merged already: not again
    assert (fixed / "spill-parents").read_bytes() == b""
