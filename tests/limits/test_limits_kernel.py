"""Real-kernel tests of per-command limits, as root (cgroups) and as nobody (rlimits).

Each test runs an executor in a driver process bounded from outside (conftest.py), attacks
with the real thing (a bounded fork bomb, an allocation, a spinner), and checks the world
from outside the command: processes counted in /proc by the driver, the cgroup's own kernel
counters, and no cgroup left anywhere under /sys/fs/cgroup once the executor closed.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import sys
from pathlib import Path

import pytest

from tests.limits.conftest import OuterCgroup, Programs, nobody_python, our_cgroups, run_driver

SPAWNS = ("setup", "bwrap")
MiB = 1 << 20


@pytest.fixture(params=SPAWNS)
def spawn(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    return name


@pytest.fixture
def python(identity: str) -> str:
    """An interpreter the identity can run (with this venv's packages on PYTHONPATH)."""
    if identity == "nobody" and os.geteuid() == 0:
        found = nobody_python()
        assert found is not None
        return found[0]
    return sys.executable


def test_fork_bomb_stops_at_the_process_limit_and_leaves_no_process(
    identity: str, spawn: str, programs: Programs
) -> None:
    token = f"limits-bomb-{secrets.token_hex(4)}"
    run = run_driver(
        identity,
        {
            "scenario": "forkbomb",
            "forkbomb": programs.forkbomb,
            "depth": 13,  # at most 16383 processes if every limit were broken
            "token": token,
            "spawn": spawn,
            "limits": {"processes": 64},
        },
    )
    r = run.result
    assert r["failed"] > 0, "the bomb never met a limit"
    # Counted from outside while the whole tree held: never past the limit, and close to
    # it (the wrapper processes of a bwrap spawn take a few of the 64).
    assert 64 - 6 <= r["observed"] <= 64
    assert r["after"] == 0
    assert r["outcome"] == "processes"
    if identity == "root":
        assert int(r["counters"]["pids.peak"]) <= 64
    else:
        nproc = [x for x in r["rlimits"] if x[0] == resource.RLIMIT_NPROC]
        assert nproc == [[resource.RLIMIT_NPROC, 64, 64]]


def test_allocation_past_the_memory_limit_is_stopped_and_reported(
    identity: str, python: str
) -> None:
    code = "b = b'x' * (512 << 20); print('allocated', len(b))"
    run = run_driver(
        identity,
        {
            "scenario": "single",
            "argv": [python, "-c", code],
            "limits": {"memory_bytes": 128 * MiB},
        },
    )
    r = run.result
    assert "allocated" not in r["stdout"]
    assert r["outcome"] == "memory"
    if identity == "root":
        assert r["signal"] == "SIGKILL"  # the cgroup's OOM killer, not the process itself
        oom = r["counters"]["memory.oom_control"]
        assert "oom_kill 0" not in oom and "oom_kill " in oom
        assert int(r["counters"]["memory.max_usage_in_bytes"]) <= 128 * MiB
    else:
        assert r["exit_code"] == 1 and "MemoryError" in r["stderr"]


def test_a_limit_on_one_command_does_not_affect_others_running_meanwhile(
    identity: str, programs: Programs
) -> None:
    token = f"limits-held-{secrets.token_hex(4)}"
    run = run_driver(
        identity,
        {
            "scenario": "concurrent",
            "forkbomb": programs.forkbomb,
            "forkcount": programs.forkcount,
            "token": token,
            "depth": 13,
            "bomb_processes": 32,
            "probe_processes": 64,
            "probe_forks": 40,
        },
    )
    r = run.result
    assert r["bomb"]["failed"] > 0 and r["bomb"]["outcome"] == "processes"
    # While the bomb sat at its limit, a command of the same executor and one of another
    # executor each forked all 40 children.
    for probe in r["probes"]:
        assert probe["exit_code"] == 0, probe["stderr"]
        assert probe["stdout"].strip() == "40"
        assert probe["outcome"] is None


def test_the_executors_own_process_is_not_charged(identity: str, python: str) -> None:
    code = "import time; b = b'x' * (32 << 20); time.sleep(1); print('done')"
    run = run_driver(
        identity,
        {
            "scenario": "single",
            "argv": [python, "-c", code],
            "limits": {"memory_bytes": 96 * MiB, "processes": 16},
            # The executor allocates far past the command's limit while it runs.
            "executor_allocates_mb": 512,
        },
    )
    r = run.result
    assert r["exit_code"] == 0 and r["stdout"].strip() == "done", r["stderr"]
    assert r["outcome"] is None
    assert r["own_cgroup_unchanged"] and r["own_limits_unchanged"]
    if identity == "root":
        assert int(r["counters"]["memory.max_usage_in_bytes"]) < 96 * MiB


def _c_project(root: Path, files: int = 24) -> None:
    src = root / "src"
    src.mkdir()
    objs = []
    for i in range(files):
        (src / f"f{i}.c").write_text(f"int f{i}(int x) {{ return x + {i}; }}\n")
        objs.append(f"f{i}.o")
    calls = " + ".join(f"f{i}(1)" for i in range(files))
    protos = "".join(f"int f{i}(int);\n" for i in range(files))
    (src / "main.c").write_text(
        f'#include <stdio.h>\n{protos}int main(void) {{ printf("%d\\n", {calls}); return 0; }}\n'
    )
    objs.append("main.o")
    (src / "Makefile").write_text(
        f"app: {' '.join(objs)}\n\tgcc -o $@ $^\n%.o: %.c\n\tgcc -O2 -c -o $@ $<\n"
    )
    os.system(f"chmod -R a+rwX {root}")


def test_defaults_let_a_parallel_make_build_pass(
    identity: str, spawn: str, readable_dir: Path
) -> None:
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("make and gcc are needed")
    _c_project(readable_dir)
    src = str(readable_dir / "src")
    run = run_driver(
        identity,
        {
            "scenario": "single",
            "argv": ["/bin/sh", "-c", f"cd {src} && make -j && ./app"],
            "spawn": spawn,
            "writable": [str(readable_dir)],
        },
    )
    r = run.result
    assert r["exit_code"] == 0, r["stderr"]
    assert r["stdout"].strip().splitlines()[-1] == str(sum(range(24)) + 24 + 0)
    assert r["outcome"] is None


def test_defaults_let_a_parallel_pytest_run_pass(
    identity: str, python: str, readable_dir: Path
) -> None:
    pytest.importorskip("xdist")
    tests = readable_dir / "test_many.py"
    tests.write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(40))\ndef test_n(i):\n"
        "    assert i * i >= 0\n"
    )
    os.chmod(tests, 0o644)
    run = run_driver(
        identity,
        {
            "scenario": "single",
            "argv": [
                python, "-m", "pytest", "-q", "-n", "4", "-p", "no:cacheprovider",
                str(tests),
            ],
            "cwd": str(readable_dir),
        },
    )  # fmt: skip
    r = run.result
    assert r["exit_code"] == 0, r["stdout"][-2000:] + r["stderr"]
    assert "40 passed" in r["stdout"]
    assert r["outcome"] is None


def test_cpu_time_limit_ends_a_spinner_with_sigxcpu(identity: str, python: str) -> None:
    run = run_driver(
        identity,
        {
            "scenario": "single",
            "argv": [python, "-c", "while True: pass"],
            "limits": {"cpu_seconds": 1},
            "timeout_s": 60,
        },
    )
    r = run.result
    assert r["signal"] == "SIGXCPU"
    assert r["outcome"] == "cpu-time"
    # Measured by the kernel for the reaped child: it ran to its limit, and no further.
    assert 0.7 <= r["cpu_seconds"] < 2.5


def test_open_files_limit_is_reported(identity: str, python: str) -> None:
    code = "fs = [open('/dev/null') for _ in range(200)]; print('opened')"
    run = run_driver(
        identity,
        {
            "scenario": "single",
            "argv": [python, "-c", code],
            "limits": {"open_files": 64},
        },
    )
    r = run.result
    assert "opened" not in r["stdout"]
    assert "Too many open files" in r["stderr"]
    assert r["outcome"] == "open-files"


def test_cpu_quota_bounds_the_whole_tree(programs: Programs) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (cpu cgroup)")
    spin = "timeout 2 sh -c 'while :; do :; done'"
    run = run_driver(
        "root",
        {
            "scenario": "single",
            "argv": ["/bin/sh", "-c", f"{spin} & {spin} & {spin} & wait"],
            "limits": {"cpu_cores": 0.25},
        },
    )
    r = run.result
    if "cpu.stat" not in r["counters"]:
        pytest.skip("no writable cpu cgroup here")
    # Three spinners for 2 s of wall time would use ~4 CPU-seconds on 2 cores; the quota
    # holds the whole tree to a quarter core.
    assert r["cpu_seconds"] < 0.25 * r["wall_seconds"] + 0.35
    assert "nr_throttled 0" not in r["counters"]["cpu.stat"]


@pytest.mark.parametrize("fill", ["tmp", "shm"])
def test_a_full_private_tmpfs_is_reported(fill: str, readable_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount tmpfs in a private mount namespace")
    run = run_driver("root", {"scenario": "tmpfull", "dir": str(readable_dir), "fill": fill})
    r = run.result
    assert r["exit_code"] != 0
    assert r["outcome"] == f"{fill}-space"
    assert r["outcome_fd"] == f"{fill}-space"
    # The mounts lived in the driver's private namespace: nothing is mounted here.
    assert not os.path.ismount(readable_dir / fill)


def test_release_kills_a_daemonised_grandchild(programs: Programs) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs cgroups (root); unprivileged, the backend's PID namespace ends it")
    sleep = shutil.which("sleep") or "/bin/sleep"
    run = run_driver("root", {"scenario": "daemon", "sleep": sleep})
    r = run.result
    assert r["exit_code"] == 0
    assert r["alive_before"] and r["other_session"], "the daemon should have outlived its command"
    assert r["killed"] >= 1
    assert not r["alive_after"]
    assert r["warnings"] == []


def test_cgroups_of_a_killed_executor_are_removed_by_the_next() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs cgroups (root)")
    outer = OuterCgroup()
    try:
        dead = run_driver("root", {"scenario": "abandon"}, outer=outer)
        assert dead.returncode == -9
        left = dead.result["cgroups"]
        assert left and all(os.path.isdir(d) for d in left)
        run_driver("root", {"scenario": "sweep"}, outer=outer)
        assert not any(os.path.exists(d) for d in left)
        assert our_cgroups(dead.pid) == [] or all(
            not d.startswith(tuple(outer.dirs)) for d in our_cgroups(dead.pid)
        )
        assert outer.leftovers() == []
    finally:
        outer.remove()
