"""Publishing a sandbox port to the host: `start(..., publish=[port])`.

A real `python -m http.server` runs inside the sandbox's own network namespace; the host
fetches it through the published URL with urllib (from outside the sandbox), and after the
task ends (kill) or the executor closes, the host port no longer accepts and the relay
process is gone.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.publish import PublishError, check_ports
from bash_seam import BashExecRequest
from tests.sandbox.conftest import LINUX_BACKENDS, require_backend

SANDBOX_PORT = 3000


@pytest.fixture(params=LINUX_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "index.html").write_text("served from inside the sandbox\n")
    return root


@pytest.fixture
async def executor(backend: str, site: Path) -> AsyncIterator[SandboxBashExecutor]:
    ex = SandboxBashExecutor(backend=backend, workspace_root=str(site), grace_ms=500)
    yield ex
    await ex.aclose()


def fetch(url: str, deadline_s: float = 20.0) -> str:
    """GET ``url`` from the host, retrying while the sandboxed server starts (bounded)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body: bytes = response.read()
                return body.decode()
        except (urllib.error.URLError, ConnectionError) as exc:
            if time.monotonic() > end:
                raise AssertionError(f"{url} never answered: {exc}") from None
            time.sleep(0.1)


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone for our purpose
        return fh.read().split(")")[-1].split()[0] != "Z"


def server_command() -> str:
    argv = [sys.executable, "-m", "http.server", str(SANDBOX_PORT), "--bind", "127.0.0.1"]
    return "exec " + shlex.join(argv)


def relay_pid(ex: SandboxBashExecutor, process_id: str) -> int:
    publication = ex._services.publications._by_task[process_id]
    assert publication.relay_pid is not None
    return publication.relay_pid


async def test_a_published_sandbox_port_is_fetched_from_the_host_then_closed_on_kill(
    executor: SandboxBashExecutor,
) -> None:
    ex = executor
    request = BashExecRequest(command=server_command())
    process = await ex.start(ex.resolve(request), publish=[SANDBOX_PORT])
    urls = ex.published(process.id)
    assert list(urls) == [SANDBOX_PORT]
    url = urls[SANDBOX_PORT]
    assert url.startswith("http://127.0.0.1:")  # loopback, never another address
    host_port = int(url.rsplit(":", 1)[1])
    # Not the number asked for: a host client of its own port-3000 service never lands here.
    assert host_port != SANDBOX_PORT
    pid = relay_pid(ex, process.id)
    body = await asyncio.to_thread(fetch, url + "/index.html")
    assert body == "served from inside the sandbox\n"
    assert process.kill()
    await process.wait()
    await asyncio.sleep(0)  # the task's done-callback closes the publication
    for _ in range(50):
        if not accepts(host_port):
            break
        await asyncio.sleep(0.1)
    assert not accepts(host_port)
    assert not pid_alive(pid)
    assert ex.published(process.id) == {}


async def test_the_executor_closing_ends_every_publication(backend: str, site: Path) -> None:
    ex = SandboxBashExecutor(backend=backend, workspace_root=str(site), grace_ms=500)
    process = await ex.start(
        ex.resolve(BashExecRequest(command=server_command())), publish=[SANDBOX_PORT]
    )
    url = ex.published(process.id)[SANDBOX_PORT]
    pid = relay_pid(ex, process.id)
    assert "served" in await asyncio.to_thread(fetch, url + "/index.html")
    await ex.aclose()
    assert not accepts(int(url.rsplit(":", 1)[1]))
    assert not pid_alive(pid)


async def test_nothing_listening_inside_closes_the_host_connection(
    executor: SandboxBashExecutor,
) -> None:
    ex = executor
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 30")), publish=[4123])
    url = ex.published(process.id)[4123]
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        await asyncio.to_thread(urllib.request.urlopen, url, None, 5)
    process.kill()
    await process.wait()


@pytest.mark.parametrize("ports", [[0], [70000], [True], list(range(1, 20))])
def test_bad_port_lists_are_refused(ports: list[int]) -> None:
    with pytest.raises(PublishError):
        check_ports(ports)


async def test_the_operator_may_publish_on_the_same_port_number(backend: str, site: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ex = SandboxBashExecutor(
        backend=backend, workspace_root=str(site), grace_ms=500, publish_same_port=True
    )
    try:
        argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        process = await ex.start(
            ex.resolve(BashExecRequest(command="exec " + shlex.join(argv))), publish=[port]
        )
        url = ex.published(process.id)[port]
        assert url == f"http://127.0.0.1:{port}"
        assert "served" in await asyncio.to_thread(fetch, url + "/index.html")
    finally:
        await ex.aclose()


_EXECUTOR_THAT_DIES = """
import asyncio, sys
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

async def main():
    ex = SandboxBashExecutor(backend=sys.argv[1], workspace_root=sys.argv[2])
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 15")), publish=[3000])
    publication = ex._services.publications._by_task[process.id]
    print(publication.relay_pid, publication.urls[3000], flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_the_relay_ends_with_the_executors_process(backend: str, site: Path) -> None:
    import signal
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-c", _EXECUTOR_THAT_DIES, backend, str(site)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        relay, url = proc.stdout.readline().split()
        assert accepts(int(url.rsplit(":", 1)[1]))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 10
    while pid_alive(int(relay)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(int(relay))
    assert not accepts(int(url.rsplit(":", 1)[1]))
