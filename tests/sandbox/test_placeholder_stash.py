"""Placeholder directories moved in and out of the workspace through the executor's stash
(`placeholder_stash.py`): reused, bounded, never handing out or keeping what anyone wrote,
recognised after a kill, and made and removed as before where a rename cannot serve. Each
checked on the host's files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_sandbox import placeholder_stash
from bash_sandbox.placeholder_stash import STASH_DIR, STASH_MAX
from bash_sandbox.placeholders import Placeholders, _ledger
from bash_seam import BashExecRequest
from policies.autorun import AUTORUN_PATHS
from tests.sandbox.conftest import ExecutorFactory, private_tmpfs

DEAD = "999999999:1"  # a holder no process is


@pytest.fixture
def base(private_base: Path) -> Path:
    """This test's own per-user base (the ledger), and an executor's state directory (the
    stash) beside it, both on the workspace's filesystem."""
    (private_base.parent / "state").mkdir(mode=0o700)
    return private_base


def stash_of(base: Path) -> Path:
    return base.parent / "state" / STASH_DIR


def holder_of(base: Path) -> Placeholders:
    """An executor's placeholders, its stash in its state directory."""
    return Placeholders(stash=str(stash_of(base)))


def names(workspace: Path, count: int) -> list[tuple[str, bool]]:
    return [(str(workspace / f".auto{i}"), True) for i in range(count)]


def test_released_placeholders_are_stashed_and_reused(base: Path, workspace: Path) -> None:
    holder = holder_of(base)
    wanted = names(workspace, 3)
    held = holder.acquire_all(wanted)
    first = {os.lstat(p).st_ino for p in held}
    assert all(os.path.isdir(p) and not os.listdir(p) for p in held)
    holder.release_all(held)
    assert os.listdir(workspace) == []  # nothing left in the workspace
    stash = stash_of(base)
    assert {e.stat().st_ino for e in os.scandir(stash)} == first
    assert stash.stat().st_mode & 0o777 == 0o700
    held = holder.acquire_all(wanted)
    assert {os.lstat(p).st_ino for p in held} == first  # moved back in, not made
    assert os.listdir(stash) == []
    holder.release_all(held)
    assert os.listdir(workspace) == []


def test_the_stash_keeps_a_bounded_number(base: Path, workspace: Path) -> None:
    holder = holder_of(base)
    held = holder.acquire_all(names(workspace, STASH_MAX + 6))
    holder.release_all(held)
    assert os.listdir(workspace) == []
    assert len(os.listdir(stash_of(base))) == STASH_MAX


def test_a_kill_after_a_directory_moved_in_is_recognised_as_ours(
    base: Path, workspace: Path
) -> None:
    holder = holder_of(base)
    holder.release_all(holder.acquire_all(names(workspace, 1)))  # one directory in the stash
    ours, users = workspace / ".envrc", workspace / ".vscode"
    intent = 1_700_000_000_123_456_789
    with _ledger(stash=str(stash_of(base))) as ledger:
        # Killed after the move, before the ledger recorded what it moved in.
        for path in (ours, users):
            ledger.entries[str(path)] = {"dir": True, "holders": [DEAD], "intent_ns": intent}
        assert ledger.stash.take(str(ours), intent)
    assert ours.is_dir() and os.lstat(ours).st_mtime_ns == intent
    users.mkdir()
    os.utime(users, ns=(5, 5))  # the user's own empty directory: another mtime and ctime
    Placeholders()  # every executor's start sweeps what dead ones left
    assert not ours.exists()
    assert users.is_dir()
    raw = (base / f"bash-sandbox-{os.geteuid()}" / "placeholders.json").read_text()
    assert json.loads(raw) == {}


@pytest.mark.parametrize("name_made_meanwhile", [False, True])
def test_a_file_written_in_as_the_placeholder_moves_out_is_given_back(
    base: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, name_made_meanwhile: bool
) -> None:
    holder = holder_of(base)
    held = holder.acquire_all(names(workspace, 1))
    placeholder = Path(held[0])
    real = placeholder_stash.move_noreplace

    def host_writes_in_the_window(src: str, dst: str) -> None:
        if src == str(placeholder):
            # An editor writes its settings after the emptiness check, before the move.
            (placeholder / "settings.json").write_text("{}\n")
            real(src, dst)
            if name_made_meanwhile:
                placeholder.mkdir()  # and another tool made the name again
            return
        real(src, dst)

    monkeypatch.setattr(placeholder_stash, "move_noreplace", host_writes_in_the_window)
    holder.release_all(held)
    found = [p for p in workspace.rglob("settings.json")]
    assert len(found) == 1 and found[0].read_text() == "{}\n"
    if name_made_meanwhile:
        assert found[0].parent.name.startswith(".auto0.bash-sandbox-")
        assert placeholder.is_dir()
    else:
        assert found[0].parent == placeholder
    assert os.listdir(stash_of(base)) == []  # the stash kept nothing of it


def test_a_stash_entry_with_something_in_it_is_never_handed_out(
    base: Path, workspace: Path
) -> None:
    holder = holder_of(base)
    holder.release_all(holder.acquire_all(names(workspace, 2)))
    stash = stash_of(base)
    dirty = stash / sorted(os.listdir(stash))[0]
    (dirty / "planted").write_text("x")
    held = holder.acquire_all(names(workspace, 2))
    assert all(os.listdir(p) == [] for p in held)
    assert (dirty / "planted").exists()  # left where it was
    holder.release_all(held)


def test_a_stash_that_is_a_symlink_is_not_used(base: Path, workspace: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stash = stash_of(base)
    stash.symlink_to(elsewhere)
    holder = holder_of(base)
    holder.release_all(holder.acquire_all(names(workspace, 2)))
    assert os.listdir(workspace) == [] and os.listdir(elsewhere) == []


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path]:
    with private_tmpfs(tmp_path / "other-fs", "1m") as path:
        yield path


def test_on_another_filesystem_placeholders_are_made_and_removed(
    base: Path, other_filesystem: Path, workspace: Path
) -> None:
    holder = Placeholders(stash=str(other_filesystem / STASH_DIR))
    wanted = names(workspace, 3)
    for _ in range(2):
        held = holder.acquire_all(wanted)
        assert sorted(held) == sorted(p for p, _ in wanted)
        holder.release_all(held)
        assert os.listdir(workspace) == []
    assert os.listdir(other_filesystem / STASH_DIR) == []


def test_a_name_made_before_the_move_in_is_never_replaced(base: Path, workspace: Path) -> None:
    holder = holder_of(base)
    holder.release_all(holder.acquire_all(names(workspace, 1)))
    users = workspace / ".idea"
    users.mkdir()  # empty: a plain rename would replace it
    with _ledger(stash=str(stash_of(base))) as ledger, pytest.raises(FileExistsError):
        ledger.stash.take(str(users), 1)
    assert users.is_dir() and len(os.listdir(stash_of(base))) == 1


async def test_an_executors_stash_serves_its_spawns_and_goes_with_it(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    stash = Path(ex._services.state.path) / STASH_DIR
    spec = ex.resolve(
        BashExecRequest(command="test -d .envrc && echo held", workdir=str(workspace))
    )
    first = await ex.run(spec)
    assert first.stdout.text == "held\n", first.stderr.text
    assert os.listdir(workspace) == []  # every placeholder gone from the host's workspace
    kept = {entry.inode() for entry in os.scandir(stash)}
    assert len(kept) == len(AUTORUN_PATHS)
    second = await ex.run(spec)
    assert second.stdout.text == "held\n", second.stderr.text
    assert os.listdir(workspace) == []
    assert {entry.inode() for entry in os.scandir(stash)} == kept  # moved in and out again
    await ex.aclose()
    assert not stash.exists()  # nothing of the executor stays


async def test_placeholders_leave_before_the_copy_back_so_its_search_never_watches_them(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spawn gives its placeholders back as soon as the command is over, before the
    # copy-back's repository search: that search then never lists and watches the
    # placeholder directories (16 of each a spawn, dropped again at the next survey), and a
    # repository the command made is still found and reset, on the host.
    from bash_sandbox.linux import dir_watch

    git_env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    watched: list[str] = []
    real_add = dir_watch.DirectoryWatch.add

    def add(self: dir_watch.DirectoryWatch, path: str) -> bool:
        watched.append(path)
        return real_add(self, path)

    monkeypatch.setattr(dir_watch.DirectoryWatch, "add", add)
    ex = make_executor(mode="workspace-write")
    spec = ex.resolve(
        BashExecRequest(command="test -d .envrc && echo held", workdir=str(workspace))
    )
    first = await ex.run(spec)
    assert first.stdout.text == "held\n", first.stderr.text
    watched.clear()
    for _ in range(3):
        again = await ex.run(spec)
        assert again.stdout.text == "held\n", again.stderr.text
        assert os.listdir(workspace) == []  # the host's workspace: no placeholder left
    placeholders = {str(workspace / name) for name in AUTORUN_PATHS}
    assert not placeholders & set(watched), sorted(placeholders & set(watched))
    made = await ex.run(
        ex.resolve(
            BashExecRequest(
                command="git init -q made && git -C made config core.hooksPath /tmp/x",
                workdir=str(workspace),
                env=git_env,
            )
        )
    )
    assert made.exit_code == 0, made.stderr.text
    config = (workspace / "made" / ".git" / "config").read_text()
    assert "hooksPath" not in config  # the new repository's control plane reset on the host
