"""A parent that ignores SIGCHLD (a daemon's way never to wait) runs `bash-sandbox run`.

An ignored disposition survives exec, so the CLI started with the kernel reaping its
children itself: the run waited for an exit status that never came (bwrap's monitor too),
forever. The entries set it back first. Each run here is started by a process that ignores
SIGCHLD and then execs the CLI, so the test (which waits with the default) reads its
status; each is bounded, and the host is checked from outside.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORING = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
@pytest.mark.parametrize("entry", ["native", "python", "module"])
def test_a_run_under_a_parent_that_ignores_sigchld_ends_with_the_commands_status(
    tmp_path: Path, workspace: Path, backend: str, entry: str
) -> None:
    argv = {
        "native": [str(ROOT / ".venv" / "bin" / "bash-sandbox")],
        "python": [str(ROOT / ".venv" / "bin" / "bash-sandbox-py")],
        "module": [sys.executable, "-m", "bash_sandbox.cli"],
    }[entry]
    if not os.path.exists(argv[0]):
        pytest.skip(f"no {argv[0]} in this checkout's venv")
    target = tmp_path / "outside" / "planted"
    target.parent.mkdir()
    command = f"echo ran; echo x > {target}; exit 3"
    done = subprocess.run(
        [sys.executable, "-c", IGNORING, argv[0], *argv[1:], "run", "--backend", backend,
         "--mode", "workspace-write", "--workspace", str(workspace), "--", command],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "BASH_SANDBOX_DAEMON": "0"},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "ran\n"
    assert not target.exists()  # refused, seen from the host
    assert str(target) in done.stderr  # and reported
