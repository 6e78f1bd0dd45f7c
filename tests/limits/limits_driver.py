"""An executor process for the limit tests: `python -m tests.limits.limits_driver` reads one
scenario as JSON on stdin and prints what it saw as JSON on stdout.

It runs in its own process so each test can bound it from outside (an outer cgroup as root,
a user namespace with RLIMIT_NPROC as nobody) and so it really is "the executor": its own
cgroups, uid and rlimits are what the code under test sees. Commands are spawned the way
the sandbox will spawn them: a `ChildSetup` pre-exec step list (cgroup entry first, the
command's own user namespace, then rlimits), or, for `"spawn": "bwrap"`, real bubblewrap
with the argv prefixes and no pre-exec step.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bash_sandbox.linux.cgroups import read_text
from bash_sandbox.linux.child_setup import (
    CLONE_NEWNS,
    CLONE_NEWUSER,
    MS_PRIVATE,
    MS_REC,
    ChildSetup,
    libc,
)
from bash_sandbox.linux.limits import (
    ExecutorLimits,
    LimitsPlan,
    apply_rlimits,
    enter_cgroups,
    entry_argv,
    find_prlimit,
    rlimit_argv,
)
from policies import ResourceLimits

# Kernel counters of a command's cgroups, read before release for the tests to check.
COUNTER_FILES = {
    "pids": ("pids.peak", "pids.events"),
    "memory": ("memory.max_usage_in_bytes", "memory.oom_control"),
    "cpu": ("cpu.stat",),
}
Scenario = Callable[[dict[str, Any]], dict[str, Any]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(func: Scenario) -> Scenario:
    SCENARIOS[func.__name__] = func
    return func


def child_setup(plan: LimitsPlan) -> ChildSetup:
    """The Landlock-style step list: enter the cgroups, own user namespace, rlimits."""
    setup = ChildSetup()
    enter_cgroups(setup, plan)
    setup.die_with_parent()
    uid, gid = os.geteuid(), os.getegid()
    setup.unshare(CLONE_NEWUSER)
    setup.write_file("/proc/self/setgroups", b"deny")
    setup.write_file("/proc/self/uid_map", f"{uid} {uid} 1".encode())
    setup.write_file("/proc/self/gid_map", f"{gid} {gid} 1".encode())
    apply_rlimits(setup, plan)
    return setup


def bwrap_argv(plan: LimitsPlan, argv: list[str], writable: list[str]) -> list[str]:
    bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
    prlimit = find_prlimit() or "/usr/bin/prlimit"
    binds = [a for w in writable for a in ("--bind", w, w)]
    return [
        *entry_argv(plan),
        bwrap,
        "--die-with-parent",
        "--unshare-user",
        "--uid",
        str(os.geteuid()),
        "--unshare-pid",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *binds,
        "--",
        *rlimit_argv(plan, prlimit),
        *argv,
    ]


class Command:
    """One spawned command with its plan; stdin is a pipe the scenario may hold open."""

    def __init__(
        self,
        limits_of: ExecutorLimits,
        limits: ResourceLimits,
        argv: list[str],
        *,
        spawn: str = "setup",
        progress: bool = False,
        writable: list[str] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.executor = limits_of
        self.plan = limits_of.prepare(f"cmd-{id(self)}", limits)
        self.progress_r: int | None = None
        pass_fds: tuple[int, ...] = ()
        progress_w = -1
        if progress:
            # Both ends above 3 first: fd 3 itself may be free and handed out by pipe().
            low_r, low_w = os.pipe()
            self.progress_r = fcntl.fcntl(low_r, fcntl.F_DUPFD_CLOEXEC, 10)
            progress_w = fcntl.fcntl(low_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(low_r)
            os.close(low_w)
            # The command finds the write end as fd 3.
            os.dup2(progress_w, 3, inheritable=True)
            pass_fds = (3,)
        if spawn == "bwrap":
            full, preexec = bwrap_argv(self.plan, argv, writable or []), None
        else:
            full, preexec = argv, child_setup(self.plan)
        # Files, not pipes: a fork bomb's thousand error lines must never block it.
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _drain
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            full,
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=self._err,
            preexec_fn=preexec,  # noqa: PLW1509 - pre-bound syscalls only
            pass_fds=pass_fds,
            start_new_session=True,
            cwd=cwd,
        )
        if progress:
            os.close(3)
            os.close(progress_w)
        self.rusage: resource.struct_rusage | None = None

    def wait_tree_complete(self, timeout_s: float = 60.0) -> dict[str, int]:
        """Read the fork bomb's progress bytes until every fork attempt is accounted for."""
        assert self.progress_r is not None
        outstanding, started, failed = 1, 0, 0
        deadline = time.monotonic() + timeout_s
        while outstanding > 0:
            ready, _, _ = select.select([self.progress_r], [], [], deadline - time.monotonic())
            if not ready:
                raise TimeoutError("fork bomb did not complete")
            data = os.read(self.progress_r, 65536)
            if not data:
                break
            for byte in data:
                outstanding -= 1
                if byte == ord("F"):
                    failed += 1
                else:
                    started += 1
                    outstanding += 2 if byte > ord("a") else 0
        return {"started": started, "failed": failed}

    def close_stdin(self) -> None:
        """EOF for the command: a holding fork bomb winds down."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.stdin = None

    def finish(self, timeout_s: float = 120.0, **roots: str) -> dict[str, Any]:
        self.close_stdin()
        code = self.proc.wait(timeout=timeout_s)
        out, err = (_drain(f) for f in (self._out, self._err))
        exit_code, sig = (code, None) if code >= 0 else (None, signal.Signals(-code).name)
        outcome = self.executor.outcome(
            self.plan,
            exit_code=exit_code,
            signal=sig,
            stderr_text=err.decode(errors="replace"),
            tmp_root=roots.get("tmp_root"),
            shm_root=roots.get("shm_root"),
        )
        counters = {
            name: read_text(os.path.join(d, name))
            for c, d in self.plan.cgroups
            for name in COUNTER_FILES.get(c, ())
        }
        leftover = self.executor.release(self.plan)
        if self.progress_r is not None:
            os.close(self.progress_r)
        return {
            "exit_code": exit_code,
            "signal": sig,
            "outcome": outcome,
            "stdout": out.decode(errors="replace"),
            "stderr": err.decode(errors="replace")[-4000:],
            "counters": counters,
            "leftover_killed": leftover,
            "rlimits": [list(r) for r in self.plan.rlimits],
            "summary": self.plan.summary,
        }


def _drain(f: Any) -> bytes:
    f.seek(0)
    data: bytes = f.read()
    f.close()
    return data


def processes_with(program: str, token: str) -> int:
    """Processes running ``program`` with ``token`` among their arguments, seen from this
    (outside) process; a wrapper whose argv merely contains them (bwrap) is not counted."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if argv[0] == program.encode() and token.encode() in argv[1:]:
            count += 1
    return count


def limits_from(params: dict[str, Any], key: str = "limits") -> ResourceLimits:
    return ResourceLimits(**params.get(key, {}))


def bomb(executor: ExecutorLimits, params: dict[str, Any], limits: ResourceLimits) -> Command:
    argv = [params["forkbomb"], str(params.get("depth", 13)), params["token"]]
    return Command(executor, limits, argv, spawn=params.get("spawn", "setup"), progress=True)


@scenario
def forkbomb(params: dict[str, Any]) -> dict[str, Any]:
    executor = ExecutorLimits()
    cmd = bomb(executor, params, limits_from(params))
    tree = cmd.wait_tree_complete()
    observed = processes_with(params["forkbomb"], params["token"])
    cmd.close_stdin()
    result = cmd.finish()
    executor.close()
    return {
        **result,
        **tree,
        "observed": observed,
        "after": processes_with(params["forkbomb"], params["token"]),
        "warnings": executor.warnings,
    }


@scenario
def concurrent(params: dict[str, Any]) -> dict[str, Any]:
    """A fork bomb at its limit in one command while two others (one from another
    executor) fork a fixed number of children."""
    first, second = ExecutorLimits(), ExecutorLimits()
    held = bomb(first, params, ResourceLimits(processes=params["bomb_processes"]))
    tree = held.wait_tree_complete()
    probes = []
    for executor in (first, second):
        probe = Command(
            executor,
            ResourceLimits(processes=params["probe_processes"]),
            [params["forkcount"], str(params["probe_forks"])],
        )
        probes.append(probe.finish())
    held.close_stdin()
    bomb_result = held.finish()
    first.close()
    second.close()
    return {"bomb": {**bomb_result, **tree}, "probes": probes}


@scenario
def single(params: dict[str, Any]) -> dict[str, Any]:
    """One command under the given limits; optionally the executor allocates meanwhile."""
    executor = ExecutorLimits()
    own_cgroup_before = read_text("/proc/self/cgroup")
    own_limits_before = read_text("/proc/self/limits")
    cmd = Command(
        executor,
        limits_from(params),
        params["argv"],
        spawn=params.get("spawn", "setup"),
        writable=params.get("writable"),
        cwd=params.get("cwd"),
    )
    ballast = None
    if params.get("executor_allocates_mb"):
        ballast = bytearray(params["executor_allocates_mb"] << 20)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = cmd.finish(timeout_s=params.get("timeout_s", 120))
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    del ballast
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    executor.close()
    return {
        **result,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "own_cgroup_unchanged": read_text("/proc/self/cgroup") == own_cgroup_before,
        "own_limits_unchanged": read_text("/proc/self/limits") == own_limits_before,
        "warnings": executor.warnings,
    }


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (dead, only waiting for its reaper)."""
    stat = read_text(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(")", 1)[1].split()[0] != "Z"


@scenario
def daemon(params: dict[str, Any]) -> dict[str, Any]:
    """A grandchild that left the command's session and process group: release kills it."""
    executor = ExecutorLimits()
    # The daemon reports its pid through a fifo only once setsid() made it a session of
    # its own, so the command ends strictly after it escaped.
    script = (
        'fifo=$(mktemp -u); mkfifo "$fifo"; '
        f'setsid /bin/sh -c \'echo $$ > "$0"; exec {params["sleep"]} 300\' "$fifo" '
        "</dev/null >/dev/null 2>&1 & "
        'read pid < "$fifo"; rm "$fifo"; echo "$pid"'
    )
    cmd = Command(executor, ResourceLimits(), ["/bin/sh", "-c", script])
    result = cmd.proc.wait(timeout=30)
    pid = int(_drain(cmd._out).decode())
    # The command is gone; its grandchild (whatever it is executing by now) is not.
    alive_before = _running(pid)
    other_session = alive_before and os.getsid(pid) != cmd.proc.pid
    killed = executor.release(cmd.plan)
    executor.close()  # waits until the killed daemon is reaped and its cgroup gone
    return {
        "exit_code": result,
        "alive_before": alive_before,
        "other_session": other_session,
        "alive_after": _running(pid),
        "killed": killed,
        "warnings": executor.warnings,
    }


@scenario
def abandon(params: dict[str, Any]) -> dict[str, Any]:
    """Make an executor's cgroups, then die without close() (SIGKILL, as a crash would)."""
    executor = ExecutorLimits()
    plan = executor.prepare("x", ResourceLimits())
    print(json.dumps({"cgroups": [d for _, d in plan.cgroups]}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


@scenario
def sweep(params: dict[str, Any]) -> dict[str, Any]:
    """A fresh executor's first prepare removes parents of dead executors."""
    executor = ExecutorLimits()
    executor.prepare("y", ResourceLimits())
    executor.close()
    return {"warnings": executor.warnings}


@scenario
def tmpfull(params: dict[str, Any]) -> dict[str, Any]:
    """Root only: two small tmpfs in a private mount namespace; the command fills one."""
    lib = libc()
    if lib.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    # Private propagation first: these mounts never reach the host's namespace.
    if lib.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount(private)")
    roots = {}
    for name in ("tmp", "shm"):
        root = os.path.join(params["dir"], name)
        os.mkdir(root)
        if lib.mount(b"tmpfs", root.encode(), b"tmpfs", 0, b"size=1m") != 0:
            raise OSError(ctypes.get_errno(), "mount tmpfs")
        roots[name] = root
    executor = ExecutorLimits()
    target = roots[params["fill"]]
    cmd = Command(executor, ResourceLimits(), ["/bin/sh", "-c", f"cat /dev/zero > {target}/f"])
    result = cmd.finish(timeout_s=30, tmp_root=roots["tmp"], shm_root=roots["shm"])
    fd = os.open(roots["tmp"], os.O_RDONLY | os.O_DIRECTORY)
    again = executor.prepare("again", ResourceLimits())
    # The same question with an fd for /tmp (what the lead may hold) and a path for shm.
    outcome_fd = executor.outcome(
        again, exit_code=1, signal=None, tmp_root=fd, shm_root=roots["shm"]
    )
    os.close(fd)
    executor.release(again)
    executor.close()
    return {**result, "outcome_fd": outcome_fd}


def main() -> None:
    params = json.loads(sys.stdin.read())
    result = SCENARIOS[params["scenario"]](params)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
