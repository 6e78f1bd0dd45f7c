"""Outside views for the MCP server tests: start servers, speak raw JSON-RPC, watch pids.

Named apart from conftest so test modules import it unambiguously next to other suites.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext

SERVER_ARGV = [sys.executable, "-m", "bash_sandbox.cli", "mcp"]


class ServerLauncher:
    """Starts `bash-sandbox mcp` for one workspace; remembers raw processes for teardown."""

    def __init__(self, workspace: Path, env: dict[str, str]) -> None:
        self.workspace = workspace
        self.env = env
        self.processes: list[subprocess.Popen[bytes]] = []

    def argv(self, *extra: str) -> list[str]:
        return [*SERVER_ARGV, "--workspace", str(self.workspace), *extra]

    def params(self, *extra: str) -> StdioServerParameters:
        argv = self.argv(*extra)
        return StdioServerParameters(command=argv[0], args=argv[1:], env=self.env)

    def client(
        self,
        *extra: str,
        mode: str = "legacy",
        user: UserAtKeyboard | None = None,
        read_timeout_seconds: float = 60,
    ) -> Client:
        """The SDK's client over a real stdio pipe; ``user`` answers elicitations."""
        return Client(
            self.params(*extra),
            mode=mode,
            elicitation_callback=user,
            read_timeout_seconds=read_timeout_seconds,
        )

    def popen(self, *extra: str) -> RawServer:
        proc = subprocess.Popen(
            self.argv(*extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        self.processes.append(proc)
        return RawServer(proc)

    def kill_all(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


class UserAtKeyboard:
    """An elicitation callback: records each question and gives the scripted answer."""

    def __init__(
        self, action: str = "accept", content: dict[str, Any] | None = None, *, fail: bool = False
    ) -> None:
        self.action = action
        self.content = content
        self.fail = fail  # the client's own UI broke: it answers with an error
        self.questions: list[types.ElicitRequestFormParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.questions.append(params)
        if self.fail:
            return types.ErrorData(code=types.INTERNAL_ERROR, message="the dialog crashed")
        return types.ElicitResult.model_validate({"action": self.action, "content": self.content})


class RawServer:
    """A server spoken to line by line, to see exactly what reaches its stdout."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.stdout_lines: list[bytes] = []
        self._next_id = 1
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def read_line(self, timeout: float = 30) -> bytes:
        """One line of stdout, within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"no line from the server within {timeout} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError("the server closed its stdout")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.stdout_lines.append(line)
        return line

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return its response (every stdout line must be JSON-RPC)."""
        request_id = self._next_id
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        while True:
            reply = json.loads(self.read_line())
            assert reply.get("jsonrpc") == "2.0", reply
            if reply.get("id") == request_id:
                return reply  # type: ignore[no-any-return]

    def initialize(self) -> None:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "0"},
            },
        )
        assert "result" in reply, reply
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = self.request("tools/call", {"name": name, "arguments": arguments})
        assert "result" in reply, reply
        return reply["result"]  # type: ignore[no-any-return]

    def wait_exit(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)


# -- /proc -------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def is_alive(pid: int) -> bool:
    """Seen from outside: does ``pid`` still run? A zombie counts as dead."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), read from /proc."""
    parents: dict[int, int] = {}
    for candidate in _all_pids():
        fields = _stat_fields(candidate)
        if fields is not None and fields[0] not in ("Z", "X"):
            parents[candidate] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def server_pid_of(workspace: Path) -> int:
    """The pid of this test process's `bash-sandbox mcp` child serving ``workspace``."""
    me = os.getpid()
    wanted = str(workspace).encode()
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields is None or int(fields[1]) != me:
            continue
        argv = cmdline(pid).split(b"\0")
        if b"mcp" in argv and wanted in argv:
            return pid
    raise AssertionError("no bash-sandbox mcp child process found")


async def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll something another process produces (a pid's end, a file); fail after ``timeout``."""
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)
        return
    raise AssertionError(f"{what} not met within {timeout} s")


def kill_if_alive(pids: set[int]) -> None:
    for pid in pids:
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
