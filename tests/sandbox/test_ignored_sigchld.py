"""A harness that ignores SIGCHLD, or set SA_NOCLDWAIT (a daemon's way never to wait).

The kernel then reaps the harness's children itself: a `Popen` leader's exit status is lost
(`Popen` reads 0, so every command "succeeded") and its group id may be reused before the
group is killed; a leader cloned from the harness (no spawn helper) was waited for forever.
Such spawns now refuse up front (`ChildrenReapedError`, nothing runs); a spawn helper is
the leader's parent and reports its exit, so confined runs through it are exact, and the
backends' probes give their child SIGCHLD's default (bwrap's own waits). Each case
runs in a process of its own (the test process keeps its default), checked from outside.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import asyncio, ctypes, json, os, signal, sys
how, backend, ws, target = sys.argv[1:5]
if how == "ignore":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
else:  # SA_NOCLDWAIT with the default handler, as a C library may set it
    action = ctypes.create_string_buffer(256)
    ctypes.c_int.from_buffer(action, 8 + 128).value = 2
    assert ctypes.CDLL(None).sigaction(signal.SIGCHLD, action, None) == 0
from bash_local import LocalBashExecutor
from bash_local.spawn import children_stay_to_be_reaped
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecError, BashExecRequest

async def main():
    out = {"reaped_by_kernel": not children_stay_to_be_reaped()}
    command = f"echo ran; echo x > {target}; exit 3"
    made = {
        "local": LocalBashExecutor(),
        "helper": SandboxBashExecutor(backend=backend, workspace_root=ws, mode="workspace-write"),
        "no-helper": SandboxBashExecutor(
            backend=backend, workspace_root=ws, mode="workspace-write", spawn_helper=False
        ),
    }
    for name, ex in made.items():
        try:
            spec = ex.resolve(BashExecRequest(command=command, workdir=ws))
            r = await asyncio.wait_for(ex.run(spec), 30)
            out[name] = {"exit": r.exit_code, "stdout": r.stdout.text,
                         "denied": [d.target for d in (r.sandbox.denials if r.sandbox else ())]}
        except BashExecError as exc:
            out[name] = {"error": getattr(exc, "code", ""), "wrote": os.path.exists(target)}
        await ex.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["ignore", "nocldwait"])
def test_spawns_the_harness_cannot_reap_refuse_and_helper_spawns_are_exact(
    tmp_path: Path, workspace: Path, backend: str, how: str
) -> None:
    target = tmp_path / "outside" / "planted"
    target.parent.mkdir()
    # A TMPDIR of its own: a cold probe cache, so the backend's probe runs under it too
    # (bwrap inherited the ignored SIGCHLD and never saw its child exit: "probe timed out").
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how, backend, str(workspace), str(target)],
        check=False, capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["reaped_by_kernel"] is True
    # Refused before anything ran: the local executor never writes what it was not run for.
    assert got["local"] == {"error": "CHILDREN_REAPED_BY_KERNEL", "wrote": False}, got
    assert got["no-helper"] == {"error": "CHILDREN_REAPED_BY_KERNEL", "wrote": False}, got
    # Through the helper: the command's own status, and the write outside refused.
    assert got["helper"]["exit"] == 3 and got["helper"]["stdout"] == "ran\n", got
    assert str(target) in got["helper"]["denied"], got
    assert not target.exists()
