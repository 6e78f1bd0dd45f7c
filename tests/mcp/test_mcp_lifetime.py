"""The server's lifetime seen from outside: every command dies with it, stdout stays clean.

Pids are read from /proc: the server's own, and the host pids of its commands (a confined
command runs in its own PID namespace, so it is found by a unique argv). Every wait is
bounded; whatever a failing test leaves alive is killed by pid.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp_probes import (
    RawServer,
    ServerLauncher,
    cmdline,
    descendants,
    is_alive,
    kill_if_alive,
    server_pid_of,
    wait_for,
)

_unique = itertools.count(1)


def _sleep_argv() -> list[str]:
    # A duration nobody else on the host uses, so its argv identifies our sleep.
    return ["sleep", f"1000.{os.getpid()}{next(_unique):03d}"]


def _host_pids(argv: list[str]) -> set[int]:
    wanted = b"\0".join(a.encode() for a in argv) + b"\0"
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and cmdline(int(e)) == wanted}


@pytest.fixture
def leftovers() -> Iterator[set[int]]:
    """Pids a test saw; any still alive at teardown are killed (and the test already failed)."""
    pids: set[int] = set()
    yield pids
    kill_if_alive(pids)


async def _running(argv: list[str]) -> set[int]:
    found: set[int] = set()

    def seen() -> bool:
        found.update(_host_pids(argv))
        return bool(found)

    await wait_for(seen, timeout=30, what=f"{argv} running")
    return found


def _assert_state_removed(tempdir: Path) -> None:
    """`aclose()` ran: no executor state dir is left (spill files stay, by design).

    A state dir is `bash-sandbox-XXXXXXXX` right under the temp dir, or `exec-XXXXXXXX` under
    the per-user base's `state/`; the per-user base and the spill dirs themselves persist.
    """
    left = []
    for path in tempdir.rglob("*"):
        if not path.is_dir():
            continue
        per_executor_top = (
            path.parent == tempdir
            and path.name.startswith("bash-sandbox-")
            and not path.name.startswith("bash-sandbox-spill-")
            and path.name != f"bash-sandbox-{os.geteuid()}"
        )
        per_executor_base = path.name.startswith("exec-") and path.parent.name == "state"
        if per_executor_top or per_executor_base:
            left.append(path)
    assert left == []


def _assert_protocol_only(raw: RawServer) -> None:
    assert raw.proc.stdout is not None
    rest = raw.proc.stdout.read()
    lines = raw.stdout_lines + [line for line in rest.split(b"\n") if line]
    assert lines, "the server wrote nothing at all"
    for line in lines:
        assert json.loads(line)["jsonrpc"] == "2.0", line


async def test_client_disconnect_kills_every_background_command(
    launcher: ServerLauncher, leftovers: set[int]
) -> None:
    sleep = _sleep_argv()
    async with launcher.client() as client:
        await client.call_tool("bash_start", {"command": " ".join(sleep)})
        await client.call_tool("bash_start", {"command": f"{' '.join(sleep)} & wait"})
        sleepers = await _running(sleep)
        await wait_for(lambda: len(_host_pids(sleep)) == 2, timeout=30, what="both sleeps")
        server = server_pid_of(launcher.workspace)
        tree = {server, *descendants(server)}
        leftovers.update(tree | _host_pids(sleep))
        assert sleepers <= tree
    await wait_for(
        lambda: not any(is_alive(p) for p in tree), timeout=30, what="server and commands gone"
    )


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_a_cancelled_call_kills_its_command(
    launcher: ServerLauncher, leftovers: set[int], era: str
) -> None:
    sleep = _sleep_argv()
    async with launcher.client(mode=era) as client:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.call_tool, "bash_run", {"command": " ".join(sleep)})
            sleepers = await _running(sleep)
            leftovers.update(sleepers)
            tasks.cancel_scope.cancel()  # the client sends notifications/cancelled
        await wait_for(
            lambda: not any(is_alive(p) for p in sleepers), timeout=30, what="command killed"
        )
        # The server itself carries on.
        still = await client.call_tool("bash_run", {"command": "echo alive"})
    assert not still.is_error


def test_building_the_cli_parser_does_not_import_the_mcp_sdk() -> None:
    code = (
        "import sys; from bash_sandbox.cli.arguments import build_parser; build_parser('0'); "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=60)
    assert out.stdout.strip() == b"[]"


async def _server_running_a_sleep(launcher: ServerLauncher, leftovers: set[int]) -> RawServer:
    """A raw server with one background sleep, seen running on the host; all pids recorded."""
    raw = launcher.popen()
    raw.initialize()
    sleep = _sleep_argv()
    result = raw.call_tool("bash_start", {"command": " ".join(sleep)})
    assert not result.get("isError"), result
    sleepers = await _running(sleep)
    leftovers.update(sleepers | descendants(raw.pid))
    return raw


async def test_eof_on_stdin_ends_the_server_and_its_commands(
    launcher: ServerLauncher, leftovers: set[int], private_tempdir: Path
) -> None:
    raw = await _server_running_a_sleep(launcher, leftovers)
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert raw.wait_exit(timeout=30) == 0
    assert not any(is_alive(p) for p in leftovers)
    _assert_state_removed(private_tempdir)
    _assert_protocol_only(raw)


async def test_eof_during_a_running_call_kills_that_command_too(
    launcher: ServerLauncher, leftovers: set[int]
) -> None:
    raw = launcher.popen()
    raw.initialize()
    sleep = _sleep_argv()
    raw.send(
        {
            "jsonrpc": "2.0",
            "id": 99,
            "method": "tools/call",
            "params": {"name": "bash_run", "arguments": {"command": " ".join(sleep)}},
        }
    )
    sleepers = await _running(sleep)
    leftovers.update(sleepers)
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert raw.wait_exit(timeout=30) == 0
    assert not any(is_alive(p) for p in sleepers)


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)]
)
async def test_a_stop_signal_ends_the_server_and_its_commands(
    launcher: ServerLauncher,
    leftovers: set[int],
    private_tempdir: Path,
    signum: signal.Signals,
    status: int,
) -> None:
    raw = await _server_running_a_sleep(launcher, leftovers)
    raw.signal(signum)  # stdin stays open: the server must not wait for the client
    assert raw.wait_exit(timeout=30) == status
    assert not any(is_alive(p) for p in leftovers)
    _assert_state_removed(private_tempdir)
    _assert_protocol_only(raw)


async def test_a_killed_server_leaves_no_command_behind(
    launcher: ServerLauncher, leftovers: set[int]
) -> None:
    raw = await _server_running_a_sleep(launcher, leftovers)
    raw.signal(signal.SIGKILL)  # no cleanup can run: the sandbox must die with its parent
    assert raw.wait_exit(timeout=30) == -signal.SIGKILL
    await wait_for(
        lambda: not any(is_alive(p) for p in leftovers), timeout=30, what="commands gone"
    )


async def test_stdout_carries_protocol_messages_only(launcher: ServerLauncher) -> None:
    raw = launcher.popen("--mode", "workspace-write")
    raw.initialize()
    noisy = (
        "echo to-stdout; echo to-stderr >&2; printf '\\033]0;title\\007'; "
        "echo to-dev-stdout > /dev/stdout; (echo to-tty > /dev/tty) 2>/dev/null; exit 3"
    )
    result = raw.call_tool("bash_run", {"command": noisy})
    assert result["structuredContent"]["exit_code"] == 3
    assert "to-dev-stdout" in result["structuredContent"]["stdout"]["text"]
    raw.send({"jsonrpc": "2.0", "method": "no/such-notification"})
    assert raw.proc.stdin is not None
    raw.proc.stdin.write(b"this is not json\n")
    raw.proc.stdin.flush()
    assert raw.call_tool("bash_list", {})["structuredContent"] == {"processes": []}
    raw.proc.stdin.close()
    assert raw.wait_exit(timeout=30) == 0
    _assert_protocol_only(raw)


def test_a_session_log_inside_the_workspace_refuses_to_start(
    launcher: ServerLauncher, workspace: Path
) -> None:
    raw = launcher.popen("--mode", "workspace-write", "--session", str(workspace / "s.jsonl"))
    assert raw.wait_exit(timeout=30) == 2
    out, err = raw.proc.communicate(timeout=30)
    assert out == b""
    assert b"session log" in err
    assert b"outside the workspace" in err
    assert not (workspace / "s.jsonl").exists()
