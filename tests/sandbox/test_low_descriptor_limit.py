"""A caller under a low open-files limit (`ulimit -Sn 256`, a service's LimitNOFILE): the
child holds two descriptors at fixed numbers (1000 and 1001) while it sets the command up,
and every confined spawn failed with EBADF there. The child now raises its soft limit for
the set-up and gives the command the caller's limits back (`rlimits.descriptor_room`).

Run in a process of its own: the test's own limits never change.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

_UNDER_A_LOW_LIMIT = """
import asyncio, json, resource, sys
backend, workspace, outside, helper = sys.argv[1:]
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

async def main():
    ex = SandboxBashExecutor(
        backend=backend, workspace_root=workspace, mode="workspace-write",
        spawn_helper=helper == "helper",
    )
    try:
        command = f"ulimit -Sn; ulimit -Hn; echo in > inside.txt; echo out > {outside}"
        r = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=workspace)))
        print(json.dumps({"exit": r.exit_code, "out": r.stdout.text.split(), "hard": hard,
                          "enforcement": r.sandbox.enforcement.value}))
    finally:
        await ex.aclose()

asyncio.run(main())
"""


@pytest.mark.parametrize("helper", ["helper", "from-the-executor"])
def test_a_low_soft_limit_still_confines_and_the_command_keeps_it(
    backend: str, workspace: Path, tmp_path: Path, helper: str
) -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1002:
        pytest.skip("this process's own hard limit is below the held descriptors")
    outside = tmp_path / "outside.txt"  # outside every writable root
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_LOW_LIMIT, backend, str(workspace), str(outside), helper],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    # Confined: the write inside landed, the one outside was refused (checked on the host).
    assert (workspace / "inside.txt").read_text() == "in\n"
    assert not outside.exists()
    assert got["exit"] != 0 and got["enforcement"] == "full"
    # The command has the caller's limits, not the set-up's.
    hard = "unlimited" if got["hard"] == resource.RLIM_INFINITY else str(got["hard"])
    assert got["out"] == ["200", hard]
