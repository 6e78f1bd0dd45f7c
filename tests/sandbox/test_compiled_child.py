"""The spawn helper's compiled child (`linux/compiled_child.py`, `native/spawn_child.c`).

It must leave a command exactly the process the Python child leaves: the same namespaces,
mounts, capabilities, filters, limits, descriptors, signals and session, judged from the
command's own /proc with both children on both backends, and the same failure reports. The
rest of the suite runs on it wherever it is built (the default), and CI asserts it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_local.spawn import LaunchedChild, Launcher, SpawnPlan
from bash_sandbox.backends.child_failure import read_child_failure
from bash_sandbox.linux import compiled_child
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.compiled_launcher import CompiledLauncher, compiled_launcher
from bash_sandbox.linux.helper_client import SpawnHelper
from bash_seam import BashExecRequest
from policies.paths import within
from tests.sandbox.conftest import ExecutorFactory

# What the command is, as its own /proc says: every line must match between the children.
# Mount ids and the overlay's per-executor directories differ between any two executors, and
# the host's own mounts that come and go meanwhile (other tests') are not the children's.
STATUS = (
    "Uid|Gid|Groups|NStgid|NSpid|NSpgid|NSsid|Sig(Blk|Ign|Cgt)|Cap(Inh|Prm|Eff|Bnd|Amb)"
    "|NoNewPrivs|Seccomp|Seccomp_filters"
)
PROBE = rf"""
grep -E '^({STATUS}):' /proc/self/status
cat /proc/self/limits
awk '{{print "M", $5, $6, $9}}' /proc/self/mountinfo
for fd in /proc/self/fd/*; do
    printf '%s ' "${{fd##*/}}"; readlink "$fd" | sed 's/[0-9][0-9]*/N/g'
done
echo; pwd; umask; ps -o pid=,pgid=,sid=,comm= -p $$ 2>/dev/null
echo x > "$1" 2>&1 || echo write refused
"""


@pytest.fixture
def built() -> Iterator[None]:
    if compiled_child._checked() is None:  # built here (`ENABLED` aside)
        if os.environ.get("CI"):
            pytest.fail("CI has a C compiler: the package's build must have built the child")
        pytest.skip("no compiled child built here: the helper forks in Python")
    yield


def test_the_helper_runs_the_compiled_child_where_it_is_built(
    built: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled_child, "ENABLED", True)
    helper = SpawnHelper()
    try:
        assert helper.compiled_child
    finally:
        helper.close()
    monkeypatch.setattr(compiled_child, "ENABLED", False)
    helper = SpawnHelper()
    try:
        assert not helper.compiled_child
    finally:
        helper.close()


def test_the_operations_are_numbered_as_the_c_side_numbers_them() -> None:
    source = (Path(compiled_child.__file__).parent / "native" / "spawn_child.c").read_text()
    enum = source[source.index("enum {") : source.index("};", source.index("enum {"))]
    names = [name.lower() for name in re.findall(r"BSC_(\w+),", enum)]
    assert tuple(names) == compiled_child.OPS


def _host_mountpoints() -> set[str]:
    with open("/proc/self/mountinfo") as fh:
        return {line.split()[4] for line in fh}


def _children_own(probe: str, workspace: Path, transient: set[str]) -> list[str]:
    """The probe's lines without the host's transient mounts: a mount point the host had
    in some snapshots and not in others, or one below /tmp outside the workspace (where
    other tests and executors mount their own, visible through the bound-back ancestors)."""
    kept = []
    for line in probe.splitlines():
        if line.startswith("M "):
            point = line.split()[1]
            if point in transient:
                continue
            if within(point, "/tmp") and point != "/tmp" and not within(point, str(workspace)):
                continue
        kept.append(line)
    return kept


async def _probe(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    on: bool,
    hosts: list[set[str]],
    *,
    helper: bool = True,
) -> str:
    """The probe's output from a command started by the helper (``helper``) or from the
    executor's own process, with the compiled child (``on``) or the Python one."""
    monkeypatch.setattr(compiled_child, "ENABLED", on)
    launched: list[str] = []
    launch = CompiledLauncher.launch

    def counted(self: CompiledLauncher, plan: SpawnPlan, **kw: int) -> LaunchedChild:
        launched.append(plan.argv[0])
        return launch(self, plan, **kw)

    monkeypatch.setattr(CompiledLauncher, "launch", counted)
    ex = make_executor(mode="workspace-write", spawn_helper=helper)
    hosts.append(_host_mountpoints())
    # A write outside the roots but inside the test's own directory: a broken sandbox
    # changes nothing of the host's.
    command = f"set -- {workspace.parent / 'outside'}\n{PROBE}"
    result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workspace))))
    hosts.append(_host_mountpoints())
    running = ex._services.spawn_helper()
    if helper:
        assert running is not None and running.compiled_child is on and not launched
    else:
        assert running is None and bool(launched) is on  # this process's compiled child
    # Seen from the host: the leader leads its own session and group (signals reach all).
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 30")))
    leader = process._spawned.pid  # type: ignore[attr-defined]
    assert (os.getsid(leader), os.getpgid(leader)) == (leader, leader)
    process.kill()
    await process.wait()
    await ex.aclose()
    assert result.exit_code == 0, result.stderr.text
    return re.sub(r"/exec-\w+/", "/exec-X/", result.stdout.text)  # each executor's state


@pytest.mark.parametrize("helper", [True, False], ids=["in-helper", "in-executor"])
async def test_both_children_make_the_same_command(
    built: None,
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    helper: bool,
) -> None:
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)  # the .git overlay too
    hosts: list[set[str]] = []
    compiled = await _probe(make_executor, workspace, monkeypatch, True, hosts, helper=helper)
    python = await _probe(make_executor, workspace, monkeypatch, False, hosts)
    transient = set.union(*hosts) - set.intersection(*hosts)
    assert _children_own(compiled, workspace, transient) == _children_own(
        python, workspace, transient
    )
    assert f"M {workspace} " in compiled  # the workspace's own mounts are compared
    # The probe saw what it must: confined, filtered, capability-less, its own session.
    assert "write refused" in compiled
    assert not (workspace.parent / "outside").exists()
    assert re.search(r"^NoNewPrivs:\s+1$", compiled, re.M)
    assert re.search(r"^Seccomp:\s+2$", compiled, re.M)
    assert re.search(r"^CapBnd:\s+0+$", compiled, re.M)
    assert f"{workspace}/.git " in compiled  # the overlay is mounted in both


@pytest.mark.parametrize("how", ["helper-compiled", "helper-python", "executor-compiled"])
async def test_failures_are_reported_alike(
    built: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    on = how.endswith("compiled")
    monkeypatch.setattr(compiled_child, "ENABLED", on)
    helper: SpawnHelper | None = None
    launcher: Launcher
    if how.startswith("helper"):
        launcher = helper = SpawnHelper()
        assert helper.compiled_child is on
    else:
        found = compiled_launcher()
        assert found is not None
        launcher = found
    report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    out_r, out_w = os.pipe()
    try:
        # A failing step: its name and errno on the report pipe, the launch refused.
        setup = ChildSetup()
        setup.make_dir(str(tmp_path / "made"))  # tolerated EEXIST on the second launch
        setup.chdir(str(tmp_path / "missing"))
        setup.report_failures_to(report_w)
        plan = SpawnPlan(argv=("/bin/true",), env={}, cwd=str(tmp_path), preexec_fn=setup)
        for _ in range(2):
            with pytest.raises(subprocess.SubprocessError):
                launcher.launch(plan, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
            failure = read_child_failure(report_r)
            assert failure is not None
            assert (failure.step, failure.errno) == (f"chdir {tmp_path}/missing", errno.ENOENT)
        assert (tmp_path / "made").is_dir()  # the steps before it ran
        # A missing working directory, then a missing program: as Popen would raise them.
        missing = SpawnPlan(
            argv=("/bin/true",), env={}, cwd=str(tmp_path / "gone"), preexec_fn=ChildSetup()
        )
        with pytest.raises(FileNotFoundError):
            launcher.launch(missing, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
        nope = SpawnPlan(
            argv=(str(tmp_path / "nope"),), env={}, cwd=str(tmp_path), preexec_fn=ChildSetup()
        )
        with pytest.raises(FileNotFoundError) as caught:
            launcher.launch(nope, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
        assert caught.value.filename == str(tmp_path / "nope")
        # And one that runs: its output, its exit status, its environment exactly as given.
        env = {"ONLY": "this", "EMPTY": ""}
        ok = SpawnPlan(
            argv=("/bin/sh", "-c", 'env | sort; pwd; exit "$1"', "sh", "7"),
            env=env,
            cwd=str(tmp_path),
            preexec_fn=ChildSetup(),
        )
        child = launcher.launch(ok, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
        for _ in range(100):  # the helper's "exit" for it (each receive waits up to 10 s)
            if helper is None or getattr(child, "returncode", None) is not None:
                break
            helper._dispatch(helper._receive(10))
        assert child.wait() == 7
        os.close(out_w)
        out_w = -1
        output = b""
        while chunk := os.read(out_r, 4096):
            output += chunk
        lines = output.decode().splitlines()
        assert [line for line in lines if "=" in line and not line.startswith("PWD=")] == [
            "EMPTY=",
            "ONLY=this",
        ]
        assert lines[-1] == str(tmp_path)
    finally:
        if helper is not None:
            helper.close()
        for fd in (report_r, report_w, out_r, out_w):
            if fd >= 0:
                os.close(fd)


_HARNESS = """
import asyncio, sys
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest
async def main():
    ex = SandboxBashExecutor(workspace_root=sys.argv[1], backend=sys.argv[2], spawn_helper=False)
    await ex.start(ex.resolve(BashExecRequest(command=f"sleep {sys.argv[3]}")))
    print("ready", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def _sleepers(seconds: str) -> list[int]:
    """Host pids of `sleep SECONDS` (a confined pid's own number is its namespace's)."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == (
                f"sleep\0{seconds}\0".encode()
            ):
                found.append(int(entry))
    return found


def test_a_command_started_in_the_executors_process_dies_with_it(
    built: None, backend: str, workspace: Path
) -> None:
    seconds = f"30.{os.getpid()}{len(backend)}"
    harness = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, str(workspace), backend, seconds],
        stdout=subprocess.PIPE,
    )
    try:
        assert harness.stdout is not None and harness.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 10
        while not _sleepers(seconds) and time.monotonic() < deadline:
            time.sleep(0.05)  # started: its exec may come a moment later
        assert _sleepers(seconds)  # the premise: it runs
        harness.kill()  # SIGKILL: no cleanup of the harness's runs
        harness.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _sleepers(seconds) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sleepers(seconds) == []
    finally:
        harness.kill()
        harness.wait()
        for pid in _sleepers(seconds):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_without_pidfds_the_executors_child_is_still_watched(
    built: None, make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open")  # as on a kernel before 5.3

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    ex = make_executor(mode="read-only", spawn_helper=False)
    result = await ex.run(ex.resolve(BashExecRequest(command="echo hi; exit 6")))
    assert (result.exit_code, result.stdout.text) == (6, "hi\n")
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 30")))
    process.kill()
    await asyncio.wait_for(process.wait(), 20)
    assert process.status == "killed"
