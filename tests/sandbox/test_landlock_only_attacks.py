"""Attacks on the Landlock-alone fallback's claims (`backends/landlock_only.py`):
each attempts the attack for real and checks the host from outside."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.backends.landlock_only import LandlockOnlyBackend
from bash_sandbox.selection import Candidates
from bash_seam import BashExecRequest
from tests.sandbox.conftest import require_backend


async def _run_alone(ws: Path, command: str, **kwargs: object) -> str:
    backend = LandlockOnlyBackend()
    probe = backend.probe(10_000)
    assert probe.usable, probe.detail
    async with SandboxBashExecutor(
        backend="landlock", mode="workspace-write", workspace_root=str(ws), **kwargs
    ) as ex:
        ex._selector._candidates = Candidates((backend,))  # as on a host without namespaces
        result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(ws))))
    assert result.sandbox is not None and result.sandbox.enforcement == "partial"
    return result.stdout.text + result.stderr.text


_FASTOPEN = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.sendto(b"fastopen-payload", socket.MSG_FASTOPEN, ("127.0.0.1", int(sys.argv[1])))
    print("SENT")
except OSError as exc:
    print("refused", exc)
"""


async def test_tcp_fast_open_under_isolated_reaches_no_host_server(tmp_path: Path) -> None:
    require_backend("landlock")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "tfo.py").write_text(_FASTOPEN)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(1.0)
    port = server.getsockname()[1]
    try:
        text = await _run_alone(ws, f"{sys.executable} tfo.py {port}", network="isolated")
        assert "refused" in text or "SENT" in text, text  # the premise: it ran
        with pytest.raises(TimeoutError):
            conn, _ = server.accept()
            conn.close()
    finally:
        server.close()


async def test_a_signal_to_a_host_process_is_refused(tmp_path: Path) -> None:
    require_backend("landlock")
    ws = tmp_path / "ws"
    ws.mkdir()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        text = await _run_alone(ws, f"kill -9 {victim.pid}; kill -0 {victim.pid} && echo ALIVE0")
        assert victim.poll() is None, text
        assert "ALIVE0" not in text
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
