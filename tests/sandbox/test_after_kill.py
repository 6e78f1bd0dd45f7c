"""Nothing of a SIGKILLed executor stays on the host (issue 22, item 5), per Linux backend.

A real executor in a child process runs a command while protected names are missing (their
placeholders sit in the workspace on the host), and is killed outright. The next executor's
start removes those placeholders, except one the user wrote since, checked from the host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bash_sandbox.placeholders import Placeholders, _ledger
from bash_sandbox.state import STALE_STATE_HOOKS, sweep_stale

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from bash_sandbox import SandboxBashExecutor
    from bash_seam import BashExecRequest
    async def main():
        ws, backend = sys.argv[1], sys.argv[2]
        ex = SandboxBashExecutor(
            workspace_root=ws, mode="workspace-write", backend=backend,
            protected_paths=(".git/hooks", ".git/config", "deploy/secrets.env", ".envrc"),
        )
        # The placeholders are made before the spawn: in place once start() returns.
        await ex.start(ex.resolve(BashExecRequest(command="sleep 60")))
        print("ready", flush=True)
        await asyncio.sleep(60)
    asyncio.run(main())
    """
)


def _kill_child_running_a_command(workspace: Path, backend: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(workspace), backend],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        assert (workspace / "deploy" / "secrets.env").is_file()  # the command sits on it
        assert (workspace / ".envrc").is_dir()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def test_next_executor_removes_a_killed_executors_placeholders(
    backend: str, workspace: Path, private_base: Path
) -> None:
    (workspace / "deploy").mkdir()
    _kill_child_running_a_command(workspace, backend)
    # A killed executor cannot clean up: the placeholders are still on the host.
    assert (workspace / "deploy" / "secrets.env").is_file()
    assert (workspace / ".envrc").is_dir()
    Placeholders()  # what every executor does at its start
    assert not (workspace / "deploy" / "secrets.env").exists()
    assert not (workspace / ".envrc").exists()
    assert (workspace / "deploy").is_dir()  # it existed before: never ours to remove


async def test_a_placeholder_the_user_wrote_since_is_kept(
    backend: str, workspace: Path, private_base: Path
) -> None:
    (workspace / "deploy").mkdir()
    _kill_child_running_a_command(workspace, backend)
    secret = workspace / "deploy" / "secrets.env"
    secret.write_text("TOKEN=mine\n")
    (workspace / ".envrc").rmdir()
    (workspace / ".envrc").mkdir()  # same kind, same emptiness, another inode
    Placeholders()
    assert secret.read_text() == "TOKEN=mine\n"
    assert (workspace / ".envrc").is_dir()
    with _ledger() as ledger:
        assert ledger.entries == {}  # forgotten, not removed


def test_a_kill_between_intent_and_creation_leaves_a_record_not_an_orphan(
    tmp_path: Path, private_base: Path
) -> None:
    # What the ledger holds when the executor died right after recording its intent.
    made = tmp_path / "made-after-intent"
    never = tmp_path / "never-made"
    with _ledger() as ledger:
        for path in (made, never):
            ledger.entries[str(path)] = {
                "dir": False,
                "holders": ["999999999:1"],
                "intent_ns": os.stat(tmp_path).st_mtime_ns,
            }
    made.touch()
    users = tmp_path / "users-empty-file"
    users.touch()
    os.utime(users, ns=(1, 1))  # mtime != ctime: not a fresh placeholder
    with _ledger() as ledger:
        ledger.entries[str(users)] = {"dir": False, "holders": ["999999999:1"], "intent_ns": 0}
    Placeholders()
    assert not made.exists() and not never.exists() and users.exists()
    raw = (private_base / f"bash-sandbox-{os.geteuid()}" / "placeholders.json").read_text()
    assert json.loads(raw) == {}


def test_the_state_sweep_runs_the_recovery_hooks_first(tmp_path: Path) -> None:
    dead = tmp_path / "exec-dead"
    dead.mkdir()
    (dead / "lock").write_text("")
    seen: list[str] = []

    def failing(path: str) -> None:
        seen.append(path)
        raise RuntimeError("import journal not replayed yet")

    STALE_STATE_HOOKS.append(failing)
    try:
        sweep_stale(str(tmp_path))
        assert dead.is_dir() and seen == [str(dead)]  # kept for a later sweep
    finally:
        STALE_STATE_HOOKS.remove(failing)
    STALE_STATE_HOOKS.append(seen.append)
    try:
        sweep_stale(str(tmp_path))  # at once: not tried again (every executor start sweeps)
        assert dead.is_dir() and seen == [str(dead)]
        marker = dead / "recovery-failed"
        os.utime(marker, (time.time() - 120, time.time() - 120))
        sweep_stale(str(tmp_path))  # after the retry interval
    finally:
        STALE_STATE_HOOKS.remove(seen.append)
    assert not dead.exists() and seen == [str(dead), str(dead)]


def test_a_ledger_write_cut_short_by_a_kill_still_reads(tmp_path: Path) -> None:
    # A kill between the in-place write and the truncate: the new ledger, then old bytes.
    from bash_sandbox.placeholders import _read

    path = tmp_path / "placeholders.json"
    cut = b'{"/w/a": {"dir": true, "holders": []}}\n": [], "/w/old": {}}'
    path.write_bytes(cut)
    fd = os.open(path, os.O_RDONLY)
    try:
        # The entries of the new ledger; its bytes as they are, so the next write replaces
        # the old tail even when the entries do not change.
        assert _read(fd) == ({"/w/a": {"dir": True, "holders": []}}, cut)
    finally:
        os.close(fd)


def test_a_ledger_transaction_writes_only_a_change_and_clears_a_cut_tail(tmp_path: Path) -> None:
    from bash_sandbox.placeholders import sweep

    path = tmp_path / "placeholders.json"
    path.write_bytes(b'{}\n": [], "/w/old": {"dir": true}}')  # a write cut short by a kill
    sweep(str(tmp_path))  # a transaction that changes no entry
    # The old tail is gone all the same (blanked: a ledger shrinks by padding, not a truncate).
    assert path.read_bytes().rstrip(b" ") == b"{}\n"
    before = path.stat()
    sweep(str(tmp_path))
    after = path.stat()
    assert path.read_bytes().rstrip(b" ") == b"{}\n"
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)


_CHILD_COMMAND = textwrap.dedent(
    """
    import asyncio, os, sys
    from bash_sandbox import SandboxBashExecutor
    from bash_seam import BashExecRequest
    async def main():
        ws, backend, command, ready = sys.argv[1:5]
        ex = SandboxBashExecutor(workspace_root=ws, mode="workspace-write", backend=backend)
        await ex.start(ex.resolve(BashExecRequest(command=command)))
        for _ in range(600):
            if os.path.exists(ready):
                break
            await asyncio.sleep(0.05)
        print("ready" if os.path.exists(ready) else "never", flush=True)
        await asyncio.sleep(60)
    asyncio.run(main())
    """
)


def _kill_mid_command(
    workspace: Path, backend: str, command: str, ready: Path, linger: float = 0.0
) -> None:
    """A harness in a child process starts ``command`` and is SIGKILLed once ``ready``
    exists (after ``linger`` seconds more: its heartbeats)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD_COMMAND, str(workspace), backend, command, str(ready)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(linger)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def _next_executor_runs(workspace: Path, backend: str) -> None:
    from bash_sandbox import SandboxBashExecutor
    from bash_seam import BashExecRequest

    ex = SandboxBashExecutor(workspace_root=str(workspace), mode="workspace-write", backend=backend)
    try:
        await ex.run(ex.resolve(BashExecRequest(command="true")))
    finally:
        await ex.aclose()


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e")
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False
    )


async def test_a_killed_executors_command_leaves_no_repository_host_git_obeys(
    backend: str, workspace: Path, private_base: Path, tmp_path: Path
) -> None:
    # A repository the command created is reset when the command is settled; the harness
    # SIGKILLed mid-command never settled it, the next executor took it for the user's,
    # and host git there ran its `core.fsmonitor` and its hook (a red team's).
    marker, hooked = tmp_path / "pwned", tmp_path / "hooked"
    assert _git("init", "-q", cwd=workspace).returncode == 0
    assert _git("commit", "-q", "--allow-empty", "-m", "a", cwd=workspace).returncode == 0
    ready = workspace / "ready"
    command = (
        f"git init -q lib && git -C lib config core.fsmonitor 'touch {marker}; echo'"
        f" && printf '#!/bin/sh\\ntouch {hooked}\\n' > lib/.git/hooks/pre-commit"
        f" && chmod +x lib/.git/hooks/pre-commit && echo x > lib/f && touch {ready}; sleep 60"
    )
    _kill_mid_command(workspace, backend, command, ready)
    lib = workspace / "lib"
    assert "fsmonitor" in (lib / ".git" / "config").read_text()  # nobody settled it
    await _next_executor_runs(workspace, backend)  # its start settles what was left
    assert "fsmonitor" not in (lib / ".git" / "config").read_text()
    assert not (lib / ".git" / "hooks" / "pre-commit").exists()
    _git("status", "--short", cwd=lib)
    _git("add", "f", cwd=lib)
    _git("commit", "-qm", "host", cwd=lib)
    assert not marker.exists() and not hooked.exists()
    assert _git("log", "--format=%s", cwd=lib).stdout.strip() == "host"  # the data kept


async def test_a_repository_the_user_makes_after_the_kill_is_left_as_it_is(
    backend: str, workspace: Path, private_base: Path, tmp_path: Path
) -> None:
    # The settling of a killed executor's command took every repository made in its roots
    # since for the command's: one the user made between the kill and the next executor's
    # start lost its hook and its config (a red team's).
    assert _git("init", "-q", cwd=workspace).returncode == 0
    ready = workspace / "ready"
    command = f"git init -q planted && touch {ready}; sleep 60"
    _kill_mid_command(workspace, backend, command, ready, linger=1.0)
    time.sleep(1.5)  # the user, a moment later
    mine = workspace / "mine"
    assert _git("init", "-q", str(mine), cwd=workspace).returncode == 0
    hook = mine / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    assert _git("config", "alias.st", "status", cwd=mine).returncode == 0
    (workspace / "planted" / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    await _next_executor_runs(workspace, backend)
    assert hook.exists()
    assert _git("config", "alias.st", cwd=mine).stdout.strip() == "status"
    # What the command made before the kill is still settled.
    assert not (workspace / "planted" / ".git" / "hooks" / "post-checkout").exists()
