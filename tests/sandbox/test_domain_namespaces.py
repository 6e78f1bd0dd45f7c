"""The isolated loopback, abstract unix sockets and ptys are per trust domain (red team
round 7, B F2 and F3; threat model rows 9, 10, 20), on both backends, forked from the
executor and through the spawn helper.

A workspace-write background call (the wider trust domain) serves on 127.0.0.1 and on an
abstract socket, writing a marker into the workspace for whatever connects (what a
debugger port, `node --inspect`, does when driven), and holds a pty whose master it types a
password into. A later read-only call of the same executor must reach neither: judged on
the host by the markers the wider call's server would have written and by what reached the
wider call's pty master. A call of the wider call's own domain still reaches its server
(ordinary multi-step work: a dev server started once, used by the next call).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.trust_domain import domain_key
from bash_seam import BashExecRequest, BashProcess, BashRunResult
from policies import SandboxMode, SandboxPolicy
from tests.sandbox.conftest import ExecutorFactory

# The wider call's server: writes `<what>.marker` into the workspace for each connection,
# with what the client sent. `ready` once both listen; gone when `stop` appears.
SERVER = r"""
import os, socket, sys, time
ws, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tcp = socket.socket(); tcp.bind(("127.0.0.1", port)); tcp.listen(4)
ab = socket.socket(socket.AF_UNIX); ab.bind("\0" + name); ab.listen(4)
for s in (tcp, ab): s.settimeout(0.05)
open(os.path.join(ws, "ready"), "w").close()
end = time.monotonic() + 60
while time.monotonic() < end and not os.path.exists(os.path.join(ws, "stop")):
    for what, s in (("tcp", tcp), ("abstract", ab)):
        try:
            conn, _ = s.accept()
        except OSError:
            continue
        conn.settimeout(2)
        data = conn.recv(100)
        with open(os.path.join(ws, what + ".marker"), "ab") as fh:
            fh.write(data + b"\n")
        conn.close()
"""

# A client: sends `who` to the TCP port and the abstract name; prints what it could reach.
CLIENT = r"""
import socket, sys
port, name, who = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
for what, family, address in (("tcp", socket.AF_INET, ("127.0.0.1", port)),
                              ("abstract", socket.AF_UNIX, "\0" + name)):
    s = socket.socket(family)
    s.settimeout(5)
    try:
        s.connect(address); s.sendall(who); print(what, "reached")
    except OSError as exc:
        print(what, "refused:", exc)
    finally:
        s.close()
"""

# The wider call's pty: types the password into the master (as pexpect's sendline does), the
# program on the slave reads it, and everything the master sees (the program's terminal
# output: echo, prompts) is logged to `pty.log` once `stop` appears.
PTY_HOLDER = r"""
import os, pty, select, sys, time
ws, secret = sys.argv[1], sys.argv[2].encode()
m, s = pty.openpty()
with open(os.path.join(ws, "pty.name"), "w") as fh: fh.write(os.ttyname(s))
seen = b""
end = time.monotonic() + 60
while time.monotonic() < end and not os.path.exists(os.path.join(ws, "stop")):
    os.write(m, secret + b"\n")
    for fd in select.select([m, s], [], [], 0.1)[0]:
        got = os.read(fd, 4096)
        if fd == m: seen += got
with open(os.path.join(ws, "pty.log"), "wb") as fh: fh.write(seen)
"""


@pytest.fixture(params=["fork", "helper"])
def spawn_path(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "helper")


def _wide(workspace: Path) -> SandboxPolicy:
    return SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(workspace))


def _narrow(workspace: Path) -> SandboxPolicy:
    return SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root=str(workspace))


async def _run(ex: SandboxBashExecutor, argv: list[str], policy: SandboxPolicy) -> BashRunResult:
    command = shlex.join(argv)
    request = BashExecRequest(command=command, sandbox_policy=policy, timeout_ms=30_000)
    return await ex.run(ex.resolve(request))


async def _start(
    ex: SandboxBashExecutor, script: str, args: list[str], policy: SandboxPolicy
) -> BashProcess:
    command = shlex.join(["python3", "-c", script, *args])
    request = BashExecRequest(command=command, sandbox_policy=policy, timeout_ms=90_000)
    return await ex.start(ex.resolve(request))


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _client(workspace: Path, port: int, name: str, who: str) -> list[str]:
    script = workspace / "client.py"
    script.write_text(CLIENT)
    return ["python3", str(script), str(port), name, who]


async def test_a_narrow_call_reaches_no_server_of_a_wider_domain_and_the_same_domain_does(
    make_executor: ExecutorFactory, workspace: Path, spawn_path: bool
) -> None:
    ex = make_executor(spawn_helper=spawn_path)
    wide, narrow = _wide(workspace), _narrow(workspace)
    port, name = 20000 + os.getpid() % 20000, f"bash-sandbox-test-{os.getpid()}"
    server = await _start(ex, SERVER, [str(workspace), str(port), name], wide)
    try:
        await _until((workspace / "ready").exists, "the wider call's server")
        attempt = await _run(ex, _client(workspace, port, name, "narrow"), narrow)
        # Judged on the host: the wider call's server never heard from the narrow call.
        for marker in ("tcp.marker", "abstract.marker"):
            assert not (workspace / marker).exists(), (workspace / marker).read_text()
        assert "reached" not in attempt.stdout.text, attempt.stdout.text
        # The wider call's own domain still reaches it: what the server wrote proves it.
        again = await _run(ex, _client(workspace, port, name, "same-domain"), wide)
        assert again.stdout.text.count("reached") == 2, again.stdout.text + again.stderr.text
        for marker in ("tcp.marker", "abstract.marker"):
            assert (workspace / marker).read_bytes() == b"same-domain\n"
    finally:
        (workspace / "stop").touch()
        await asyncio.wait_for(server.wait(), 30)


async def test_a_narrow_call_can_neither_read_nor_write_a_wider_calls_pty(
    make_executor: ExecutorFactory, workspace: Path, spawn_path: bool
) -> None:
    ex = make_executor(spawn_helper=spawn_path)
    secret = "hunter2-" + os.urandom(4).hex()
    holder = await _start(ex, PTY_HOLDER, [str(workspace), secret], _wide(workspace))
    try:
        await _until((workspace / "pty.name").exists, "the wider call's pty")
        tty = (workspace / "pty.name").read_text()
        steal = f"timeout 2 cat {tty} & echo FAKE-PROMPT > {tty}; wait"
        request = BashExecRequest(command=steal, sandbox_policy=_narrow(workspace))
        attempt = await ex.run(ex.resolve(request))
    finally:
        (workspace / "stop").touch()
        await asyncio.wait_for(holder.wait(), 30)
    # Judged from the wider call's side: its terminal shows its own input, no faked prompt.
    seen = (workspace / "pty.log").read_bytes()
    assert secret.encode() in seen  # the pty worked and was watched
    assert b"FAKE-PROMPT" not in seen
    assert secret not in attempt.stdout.text


async def test_each_domain_gets_its_own_namespaces_once_released_at_aclose(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    wide, narrow = _wide(workspace), _narrow(workspace)
    net = "readlink /proc/self/ns/net"
    first = await _run(ex, net.split(), narrow)
    second = await _run(ex, net.split(), narrow)
    other = await _run(ex, net.split(), wide)
    assert first.stdout.text == second.stdout.text  # kept for the domain
    assert first.stdout.text != other.stdout.text
    namespaces = ex._services.namespaces
    made = namespaces.domain_ready(domain_key(narrow))
    assert made is not None and namespaces.domain_ready(domain_key(wide)) is not None
    inode = os.fstat(made.net).st_ino
    await ex.aclose()
    assert namespaces.domain_ready(domain_key(narrow)) is None
    # The descriptor is gone (or reused for something else than that namespace).
    with contextlib.suppress(OSError):
        assert os.fstat(made.net).st_ino != inode
