"""Threat-model row 10 and the network issue: the executor's namespace, real servers on the host.

Every server here is started by the test on 127.0.0.1/::1 or an abstract/pathname unix socket
of its own, and counts what reached it; the verdict comes from those counters, not stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.linux.supervisor import CONNECT_PENDING_MAX, CONNECT_WAITING_MAX
from bash_seam import BashExecRequest, BashRunResult
from policies import network_denial_marker
from tests.sandbox.conftest import ExecutorFactory

# The base interpreter, not the venv's: a venv under /tmp is hidden by the private /tmp of
# workspace-write (these scripts only need the standard library).
PY = os.path.realpath(sys.executable)


class CountingServer:
    """A host-side server that records every connection or datagram it receives."""

    def __init__(self, family: int, kind: int, address: object) -> None:
        self.sock = socket.socket(family, kind)
        self.sock.bind(address)  # type: ignore[arg-type]
        if kind == socket.SOCK_STREAM:
            self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.hits = 0
        self._stop = threading.Event()
        self._kind = kind
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> object:
        return self.sock.getsockname()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                if self._kind == socket.SOCK_STREAM:
                    conn, _ = self.sock.accept()
                    conn.close()
                else:
                    self.sock.recvfrom(65536)
                self.hits += 1
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@contextlib.contextmanager
def servers(tmp_path: Path) -> Iterator[dict[str, CountingServer]]:
    made = {
        "tcp4": CountingServer(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)),
        "udp4": CountingServer(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)),
        "tcp6": CountingServer(socket.AF_INET6, socket.SOCK_STREAM, ("::1", 0)),
        "abstract": CountingServer(
            socket.AF_UNIX, socket.SOCK_STREAM, f"\0bash-sandbox-test-{os.getpid()}-{id(tmp_path)}"
        ),
        "pathname": CountingServer(socket.AF_UNIX, socket.SOCK_STREAM, str(tmp_path / "host.sock")),
    }
    try:
        yield made
    finally:
        for server in made.values():
            server.close()


def _client_script(s: dict[str, CountingServer]) -> str:
    tcp4 = s["tcp4"].address
    udp4 = s["udp4"].address
    tcp6 = s["tcp6"].address
    abstract = s["abstract"].address
    pathname = s["pathname"].address
    return f"""
import socket
def attempt(name, family, kind, addr, send=False):
    try:
        c = socket.socket(family, kind)
        c.settimeout(1)
        if send:
            c.sendto(b"x", addr)  # UDP "succeeds" locally: only the server's count decides
            print(name, "sent")
            return
        c.connect(addr)
        print(name, "REACHED")
    except OSError as exc:
        print(name, "refused", exc)
attempt("tcp4", socket.AF_INET, socket.SOCK_STREAM, {tcp4!r})
attempt("udp4", socket.AF_INET, socket.SOCK_DGRAM, {udp4!r}, send=True)
attempt("tcp6", socket.AF_INET6, socket.SOCK_STREAM, {tcp6[:2]!r})
attempt("abstract", socket.AF_UNIX, socket.SOCK_STREAM, {abstract!r})
attempt("pathname", socket.AF_UNIX, socket.SOCK_STREAM, {pathname!r})
"""


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path, **kw: object) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir), **kw)))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_isolated_network_reaches_no_host_service(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, mode: str
) -> None:
    ex = make_executor(mode=mode)
    with servers(tmp_path) as s:
        script = workspace / "client.py"
        script.write_text(_client_script(s))
        result = await _run(ex, f"{PY} client.py", workspace)
        hits = {name: server.hits for name, server in s.items()}
    assert result.exit_code == 0, result.stderr.text
    assert "REACHED" not in result.stdout.text
    assert hits == dict.fromkeys(hits, 0)
    assert result.sandbox is not None
    assert result.sandbox.network == "isolated"
    assert result.sandbox.enforcement == "full"


async def test_host_network_reaches_the_host_server(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    ex = make_executor(network="host")
    with servers(tmp_path) as s:
        port = s["tcp4"].address[1]  # type: ignore[index]
        result = await _run(
            ex,
            f'{PY} -c "import socket; socket.create_connection(('
            f"'127.0.0.1', {port}), timeout=2).close(); print('ok')\"",
            workspace,
        )
        deadline = 50
        while s["tcp4"].hits == 0 and deadline:
            deadline -= 1
            threading.Event().wait(0.05)
        assert s["tcp4"].hits == 1
    assert result.stdout.text.strip() == "ok"
    assert result.sandbox is not None and result.sandbox.network == "host"


async def test_loopback_inside_the_sandbox_works(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    server = (
        "import socket,threading\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1)\n"
        "threading.Thread(target=lambda: s.accept()[0].sendall(b'pong'), daemon=True).start()\n"
        "c=socket.create_connection(s.getsockname()); print(c.recv(4).decode())\n"
    )
    result = await _run(ex, f'{PY} -c "{server}"', workspace)
    assert result.stdout.text.strip() == "pong", result.stderr.text


async def test_background_server_is_reachable_from_later_calls_only_of_this_executor(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    port_file = workspace / "port"
    server = await ex.start(
        ex.resolve(
            BashExecRequest(
                command=f"{PY} -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); "
                f"s.listen(8); open('port.tmp','w').write(str(s.getsockname()[1])); "
                f"import os; os.rename('port.tmp','port')\n"
                f"while True: c,_=s.accept(); c.sendall(b'hello'); c.close()\"",
                workdir=str(workspace),
            )
        )
    )
    try:
        waited = await _run(
            ex, "for i in $(seq 100); do [ -s port ] && exit 0; sleep 0.05; done; exit 1", workspace
        )
        assert waited.exit_code == 0
        port = int(port_file.read_text())
        client = (
            f'{PY} -c "import socket; '
            f"print(socket.create_connection(('127.0.0.1',{port}),timeout=2).recv(5).decode())\""
        )
        same = await _run(ex, client, workspace)
        assert same.stdout.text.strip() == "hello", same.stderr.text
        # The host cannot reach it...
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
        # ...and neither can another executor's commands.
        other = make_executor(workspace_root=str(workspace))
        foreign = await _run(other, client, workspace)
        assert foreign.exit_code != 0
        assert "hello" not in foreign.stdout.text
        # Its own loopback simply has nothing there: refused, and not a sandbox denial.
        assert foreign.sandbox is not None and not foreign.sandbox.network_denied
    finally:
        server.kill()
        await server.wait()


async def test_a_refused_loopback_connection_is_not_a_network_denial(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The sandbox's own loopback has nothing on the host server's port (a dev server not up
    # yet looks the same): refused, but nothing was denied.
    ex = make_executor()
    with servers(tmp_path) as s:
        port = s["tcp4"].address[1]  # type: ignore[index]
        result = await _run(ex, f"curl -sS --max-time 3 http://127.0.0.1:{port}/", workspace)
        assert s["tcp4"].hits == 0
    assert result.exit_code not in (0, None)
    assert result.sandbox is not None
    assert result.sandbox.network_denied is False
    assert result.sandbox.denials == ()


async def test_a_connection_leaving_the_isolated_network_is_a_denial_seen_by_the_supervisor(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    result = await _run(ex, "curl -sS --max-time 3 http://192.0.2.1:8080/", workspace)
    assert result.exit_code not in (0, None)
    assert result.sandbox is not None and result.sandbox.network_denied is True
    assert result.sandbox.denied is False
    (denial,) = result.sandbox.denials
    assert (denial.kind, denial.target, denial.evidence) == (
        "network-connect",
        "192.0.2.1:8080",
        "supervisor",
    )
    assert network_denial_marker() == "[sandbox: network access denied under isolated network]"


def _netns_holders(inode: str) -> list[str]:
    """Every process namespace link or open fd on this host that still points at ``inode``."""
    found: list[str] = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/net") == inode:
                found.append(f"{pid}:ns")
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == inode:
                        found.append(f"{pid}:fd{fd}")
    return found


async def test_aclose_leaves_no_namespace_mount_or_process(backend: str, workspace: Path) -> None:
    bound_before = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    ex = SandboxBashExecutor(
        backend=backend, workspace_root=str(workspace), grace_ms=300, mode="workspace-write"
    )
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(command="sleep 300 & echo $! > pid; wait", workdir=str(workspace))
        )
    )
    result = await _run(
        ex, "for i in $(seq 100); do [ -s pid ] && exit 0; sleep 0.05; done", workspace
    )
    assert result.exit_code == 0
    namespaces = ex._services.namespaces.ready
    assert namespaces is not None
    inode = os.readlink(f"/proc/self/fd/{namespaces.net}")
    assert _netns_holders(inode)
    await ex.aclose()
    await proc.wait()
    assert _netns_holders(inode) == []
    bound_after = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    assert bound_after == bound_before
    with open("/proc/self/mountinfo") as fh:
        assert "bash-sandbox" not in fh.read()


_HOG = f"""{PY} - <<'EOF'
import socket, threading, time
server = socket.socket(socket.AF_UNIX)
server.bind("/tmp/hog.sock")
server.listen(0)  # never accepted: every connect past the backlog blocks
def connect():
    with socket.socket(socket.AF_UNIX) as c:
        c.connect("/tmp/hog.sock")
        time.sleep(600)
for _ in range(40):
    threading.Thread(target=connect, daemon=True).start()
print("hogging", flush=True)
time.sleep(600)
EOF"""

_BLOCKING_CONNECT = f"""{PY} - <<'EOF'
import socket
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(4)
client = socket.socket()  # blocking, no timeout: what psql, redis-cli and bash's /dev/tcp do
client.connect(server.getsockname())
print("connected")
EOF"""


@contextlib.asynccontextmanager
async def _background(ex: SandboxBashExecutor, command: str, word: str) -> AsyncIterator[None]:
    """``command`` running in the background once it printed ``word``; killed after."""
    process = await ex.start(ex.resolve(BashExecRequest(command=command)))
    try:
        for _ in range(100):
            if word in ex.read_output(process.id).delta:
                break
            await asyncio.sleep(0.1)
        yield
    finally:
        ex.kill(process.id)
        await process.wait()


async def test_a_command_holding_its_connects_blocked_never_stalls_another_commands(
    make_executor: ExecutorFactory,
) -> None:
    # The supervisor performs blocking connects on a pool: one shared by every command of
    # the executor let a background task fill it with connects to its own full backlog, and
    # every later command's blocking connect then hung until its timeout.
    ex = make_executor()
    async with _background(ex, _HOG, "hogging"):
        await asyncio.sleep(1)  # its connects reach the supervisor
        victim = await ex.run(
            ex.resolve(BashExecRequest(command=_BLOCKING_CONNECT, timeout_ms=15_000))
        )
    assert not victim.timed_out, "a blocking connect waited for another command's"
    assert victim.stdout.text == "connected\n", victim.stderr.text


_SERVE_FULL = f"""{PY} - <<'EOF'
import socket, time
server = socket.socket(socket.AF_UNIX)
server.bind("/tmp/full.sock")
server.listen(0)  # never accepted: every connect past the backlog blocks
print("serving", flush=True)
time.sleep(600)
EOF"""

_CONNECT_AND_LEAVE = f"""{PY} - <<'EOF'
import os, socket, struct, threading, time
socks = []
def connect(c):
    try:
        c.connect("/tmp/full.sock")
    except OSError:
        pass
for _ in range(24):
    c = socket.socket(socket.AF_UNIX)
    socks.append(c)
    threading.Thread(target=connect, args=(c,), daemon=True).start()
time.sleep(0.3)
for c in socks:  # no timeout at all from here on (the supervisor's slices read it)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("@ll", 0, 0))
time.sleep(1)
print("leaving", flush=True)
os._exit(0)
EOF"""


def _holders(sock: str, count: int) -> str:
    """Python that listens on ``sock`` and never accepts, with ``count`` threads each
    blocked connecting to it (every one past the backlog waits on the supervisor)."""
    return f"""import os, signal, socket, threading, time
server = socket.socket(socket.AF_UNIX)
server.bind("{sock}")
server.listen(0)
def hold():
    with socket.socket(socket.AF_UNIX) as c:
        try:
            c.connect("{sock}")
        except OSError:
            pass
        time.sleep(600)
for _ in range({count}):
    threading.Thread(target=hold, daemon=True).start()
"""


_FLOOD = f"""{PY} - <<'EOF'
{_holders("flood.sock", 400)}print("flooding", flush=True)
time.sleep(600)
EOF"""


def _connect_threads() -> int:
    return sum(t.name.startswith("bash-sandbox-connect") for t in threading.enumerate())


async def test_connects_a_finished_command_left_blocked_free_the_executors_threads(
    make_executor: ExecutorFactory,
) -> None:
    # The supervisor connects for the command on a duplicate of its socket: a connect to a
    # listener that never accepts (a same-domain dev server with a full backlog) stayed
    # blocked after the command was gone, 16 threads and 32 descriptors of the executor a
    # run, until the harness ran out of descriptors (a red team's).
    ex = make_executor(mode="workspace-write")
    async with _background(ex, _SERVE_FULL, "serving"):
        fds_before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            result = await ex.run(
                ex.resolve(BashExecRequest(command=_CONNECT_AND_LEAVE, timeout_ms=30_000))
            )
            assert result.stdout.text == "leaving\n", result.stderr.text
        for _ in range(100):  # the supervisor interrupts them within half a second
            if _connect_threads() == 0:
                break
            await asyncio.sleep(0.1)
        assert _connect_threads() == 0
        assert len(os.listdir("/proc/self/fd")) <= fds_before


async def test_one_commands_connects_hold_a_bounded_share_of_the_executors_descriptors(
    make_executor: ExecutorFactory,
) -> None:
    # Each connect the supervisor takes holds the command's socket (and the target's) until
    # it is answered: a command's four hundred blocked connects took the harness to EMFILE
    # while it ran (a red team's). Past a bound they are answered EAGAIN.
    ex = make_executor(mode="workspace-write")
    fds_before = len(os.listdir("/proc/self/fd"))
    async with _background(ex, _FLOOD, "flooding"):
        await asyncio.sleep(2)  # its connects reach the supervisor
        held = len(os.listdir("/proc/self/fd")) - fds_before
        assert held <= 2 * CONNECT_PENDING_MAX + 32, held
        other = await ex.run(ex.resolve(BashExecRequest(command="echo other-ok")))
        assert other.stdout.text == "other-ok\n"


_BURST = f"""{PY} - <<'EOF'
import os, socket, threading, time
server = socket.socket(socket.AF_UNIX)
server.bind("burst.sock")
server.listen(8)
def serve():
    for _ in range(100):
        conn, _ = server.accept()
        conn.close()
        time.sleep(0.01)
threading.Thread(target=serve, daemon=True).start()
results = []
def client():
    with socket.socket(socket.AF_UNIX) as c:
        try:
            c.connect("burst.sock")
            results.append("ok")
        except OSError as e:
            results.append(e.strerror)
threads = [threading.Thread(target=client) for _ in range(100)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
print(sorted(set(results)), len(results))
EOF"""


async def test_a_burst_of_blocking_connects_past_the_bound_waits_and_succeeds(
    make_executor: ExecutorFactory,
) -> None:
    # Past a command's bound of pending connects they were answered EAGAIN: a hundred
    # clients of a slow local server lost a fifth of their connects (a red team's). They
    # wait for a slot now, as a blocking connect waits for a full backlog.
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command=_BURST, timeout_ms=120_000)))
    assert result.stdout.text == "['ok'] 100\n", result.stderr.text


_RESTARTING = f"""{PY} - <<'EOF'
{_holders("storm.sock", 70)}time.sleep(1)  # every connect slot of this command taken, and then some
child = os.fork()
if child == 0:
    import ctypes, errno
    libc = ctypes.CDLL(None, use_errno=True)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    c = socket.socket(socket.AF_UNIX)
    path = b"storm.sock"
    addr = ctypes.create_string_buffer(b"\\x01\\x00" + path + b"\\x00", 2 + len(path) + 1)
    while libc.connect(c.fileno(), addr, len(addr)) < 0 and ctypes.get_errno() == errno.EINTR:
        pass  # restarted at once, as SA_RESTART does: a new notification each time
    os._exit(0)
time.sleep(0.3)
end = time.monotonic() + 4
sent = 0
while time.monotonic() < end:
    os.kill(child, signal.SIGUSR1)
    sent += 1
print("storm", sent > 1000, flush=True)
time.sleep(600)
EOF"""


async def test_a_signal_storm_on_a_waiting_connect_keeps_the_queue_bounded(
    make_executor: ExecutorFactory,
) -> None:
    # A connect past the command's bound waits in the supervisor; each signal that restarts
    # it made a new notification, and a storm queued a hundred thousand of them in the
    # executor's memory (a red team's).
    ex = make_executor(mode="workspace-write")
    async with _background(ex, _RESTARTING, "storm"):
        supervisor = ex._services.supervisor()
        assert supervisor._waiting <= CONNECT_WAITING_MAX
        assert all(len(c.waiting) <= CONNECT_WAITING_MAX for c in supervisor._commands.values())
