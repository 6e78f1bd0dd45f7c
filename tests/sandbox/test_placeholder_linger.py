"""One executor's placeholder holds (`placeholder_linger.py`): shared in memory by its
overlapping spawns (the ledger asked only by the first and the last), and, when
`placeholder_linger_ms` asks for it, kept a moment for the next spawn; gone from the host
once nobody holds them, once the linger is over, and when the executor closes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from bash_sandbox.placeholder_linger import LingeringPlaceholders
from bash_sandbox.placeholders import Placeholders
from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory


class _Counted(Placeholders):
    """The real ledger, its transactions counted."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = 0

    def acquire_all(self, wanted):  # type: ignore[no-untyped-def]
        self.transactions += 1
        return super().acquire_all(wanted)

    def release_all(self, paths):  # type: ignore[no-untyped-def]
        self.transactions += 1
        super().release_all(paths)


def test_overlapping_spawns_share_without_the_ledger(private_base: Path, workspace: Path) -> None:
    inner = _Counted()
    holds = LingeringPlaceholders(inner)
    wanted = [(str(workspace / ".vscode"), True), (str(workspace / "deploy.env"), False)]
    first = holds.acquire_all(wanted)
    second = holds.acquire_all(wanted)  # a command started while the first runs
    assert sorted(first) == sorted(second) == sorted(p for p, _ in wanted)
    assert inner.transactions == 1
    holds.release_all(first)
    assert (workspace / ".vscode").is_dir() and (workspace / "deploy.env").is_file()
    assert inner.transactions == 1  # still held by the second
    holds.release_all(second)
    assert os.listdir(workspace) == []  # the last one gone: removed from the host
    assert inner.transactions == 2


def test_a_placeholder_the_user_removed_meanwhile_is_made_again(
    private_base: Path, workspace: Path
) -> None:
    holds = LingeringPlaceholders(Placeholders(), linger_s=60)
    path = str(workspace / ".idea")
    holds.release_all(holds.acquire_all([(path, True)]))
    assert os.path.isdir(path)  # lingering
    os.rmdir(path)  # the user's
    assert holds.acquire_all([(path, True)]) == [path]
    assert os.path.isdir(path)
    holds.close()
    assert os.listdir(workspace) == []


def test_only_directories_linger(private_base: Path, workspace: Path) -> None:
    holds = LingeringPlaceholders(Placeholders(), linger_s=60)
    held = holds.acquire_all([(str(workspace / ".zed"), True), (str(workspace / "a.env"), False)])
    holds.release_all(held)
    # An empty placeholder file would show in the user's `git status`: given back at once.
    assert os.listdir(workspace) == [".zed"]
    holds.close()
    assert os.listdir(workspace) == []


async def test_a_configured_linger_keeps_them_for_the_next_command_then_removes_them(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write", placeholder_linger_ms=300)
    spec = ex.resolve(
        BashExecRequest(command="test -d .vscode && echo held", workdir=str(workspace))
    )
    first = await ex.run(spec)
    assert first.stdout.text == "held\n"
    assert (workspace / ".vscode").is_dir()  # kept a moment for the next command
    inode = (workspace / ".vscode").stat().st_ino
    second = await ex.run(spec)
    assert second.stdout.text == "held\n"
    assert (workspace / ".vscode").stat().st_ino == inode  # taken over, not made again
    refused = await ex.run(
        ex.resolve(BashExecRequest(command="echo x > .vscode/tasks.json", workdir=str(workspace)))
    )
    assert refused.exit_code != 0 and not (workspace / ".vscode" / "tasks.json").exists()
    for _ in range(100):
        if not (workspace / ".vscode").exists():
            break
        await asyncio.sleep(0.05)
    assert os.listdir(workspace) == []  # gone once the linger is over
    await ex.run(spec)
    await ex.aclose()
    assert os.listdir(workspace) == []  # and when the executor closes


async def test_by_default_nothing_stays_after_the_command(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command="ls -A", workdir=str(workspace))))
    assert ".vscode" in result.stdout.text.split()
    assert os.listdir(workspace) == []


async def test_a_danger_full_access_command_sees_no_lingering_placeholder(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # danger-full-access is the local executor's spawn: the workspace as the user has it.
    ex = make_executor(mode="workspace-write", placeholder_linger_ms=60_000)
    await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    assert (workspace / ".vscode").is_dir()  # lingering
    listed = await ex.run(
        ex.resolve(
            BashExecRequest(
                command="ls -A", workdir=str(workspace), sandbox_mode="danger-full-access"
            )
        )
    )
    assert listed.exit_code == 0 and listed.stdout.text == ""
    assert os.listdir(workspace) == []
    again = await ex.run(
        ex.resolve(BashExecRequest(command="test -d .vscode && echo held", workdir=str(workspace)))
    )
    assert again.stdout.text == "held\n"  # a later confined command holds them again
    await ex.aclose()
    assert os.listdir(workspace) == []


@pytest.mark.parametrize("linger_ms", [0, 60_000])
async def test_a_user_file_in_a_lingering_placeholder_stays_the_users(
    make_executor: ExecutorFactory, workspace: Path, linger_ms: int
) -> None:
    ex = make_executor(mode="workspace-write", placeholder_linger_ms=linger_ms)
    await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    if linger_ms:
        (workspace / ".vscode" / "settings.json").write_text("{}\n")  # the user, meanwhile
    await ex.aclose()
    assert ((workspace / ".vscode" / "settings.json").exists()) == bool(linger_ms)


def test_a_zombie_holder_holds_nothing_and_a_vanished_placeholder_is_made_again(
    private_base: Path, workspace: Path
) -> None:
    # A killed executor its parent never reaped (a container's PID 1) kept its placeholders
    # "held"; once the user removed them, every later spawn covered a missing path and
    # failed as `SandboxUnavailableError` (a red team's).
    import json

    from bash_sandbox import placeholders

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        for _ in range(200):  # the child has exited once its state is Z
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        with open(f"/proc/{pid}/stat", "rb") as fh:
            start = fh.read().rsplit(b")", 1)[1].split()[19].decode()
        assert not placeholders._alive(f"{pid}:{start}", {})
        path = workspace / ".vscode"
        ledger = private_base / "placeholders.json"
        ledger.write_text(json.dumps({str(path): {"dir": True, "holders": [f"{pid}:{start}"]}}))
        holds = Placeholders()  # sweeps what dead holders left
        assert holds.acquire_all([(str(path), True)]) == [str(path)]
        assert path.is_dir()
        # Recorded for a live holder, but removed meanwhile: made again, not trusted.
        os.rmdir(path)
        assert holds.acquire_all([(str(path), True)]) == [str(path)]
        assert path.is_dir()
    finally:
        os.waitpid(pid, 0)
