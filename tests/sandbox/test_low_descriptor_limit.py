"""The harness's descriptors and the child's. The child holds two descriptors at fixed
numbers (1000 and 1001) while it sets the command up:

- under a low open-files soft limit (`ulimit -Sn 256`, a service's LimitNOFILE) every
  confined spawn failed with EBADF; the child now raises its soft limit for the set-up and
  gives the command the caller's limits back (`rlimits.descriptor_room`);
- a harness with about 990 descriptors open had the executor's own (a namespace's) numbered
  1000 or 1001, which the hold overwrote (setns failed); those numbers are now kept taken
  in the harness from the executor's start (`rlimits.reserve_held_fds`);
- a harness with more than 1,024 descriptors open could not start an executor at all
  (`select()` refused the numbers); `poll` now.

Each case runs in a process of its own: the test's own limits and descriptors never change.
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


_WITH_MANY_OPEN = """
import asyncio, json, os, sys
backend, workspace, outside, count = sys.argv[1:]
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(count))]
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

async def main():
    ex = SandboxBashExecutor(backend=backend, workspace_root=workspace, mode="workspace-write")
    try:
        for _ in range(2):
            command = f"echo in >> inside.txt; echo out > {outside}"
            r = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=workspace)))
            print(json.dumps({"exit": r.exit_code, "enforcement": r.sandbox.enforcement.value}))
    finally:
        await ex.aclose()

asyncio.run(main())
"""


@pytest.mark.parametrize("count", [988, 990, 993, 996, 1100])
def test_a_harness_with_many_descriptors_open_still_confines(
    backend: str, workspace: Path, tmp_path: Path, count: int
) -> None:
    # With `count` open, the executor's own descriptors are numbered around the child's
    # held ones (988-996), or past what select() takes (1100).
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("this process's open-files limit is below the test's descriptors")
    outside = tmp_path / "outside.txt"
    done = subprocess.run(
        [sys.executable, "-c", _WITH_MANY_OPEN, backend, str(workspace), str(outside), str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["enforcement"] for r in runs] == ["full", "full"]
    assert all(r["exit"] != 0 for r in runs)  # the write outside refused
    assert (workspace / "inside.txt").read_text() == "in\nin\n"
    assert not outside.exists()
