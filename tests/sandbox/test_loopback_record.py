"""The supervisor keeps the private-loopback destinations that refused a connect, so the
facts can say "the host serves that port; this sandbox has its own loopback"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bash_sandbox.linux import supervisor
from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory

CLIENT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
    "except OSError as e:\n"
    "    print(e.errno)\n"
)


async def test_refused_loopback_connects_are_kept(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, ...]] = []
    keep = supervisor.SupervisedCommand.record_refused_loopback

    def spy(self: supervisor.SupervisedCommand, destination: str) -> None:
        keep(self, destination)
        seen.append(self.loopback_connects())

    monkeypatch.setattr(supervisor.SupervisedCommand, "record_refused_loopback", spy)
    (workspace / "c.py").write_text(CLIENT)
    ex = make_executor(mode="read-only", network="isolated")
    command = "python3 c.py 127.0.0.1 5999; python3 c.py ::1 6001; python3 c.py 127.0.0.1 5999"
    result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workspace))))
    assert result.stdout.text.split() == ["111", "111", "111"]  # ECONNREFUSED, own loopback
    assert seen[-1] == ("127.0.0.1:5999", "[::1]:6001")
