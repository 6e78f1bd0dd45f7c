"""The executor process of the limit tests: `python -m tests.limits.limits_driver` reads one
scenario as JSON on stdin, drives real `SandboxBashExecutor`s through it, and prints what it
saw as JSON on stdout.

It is a process of its own so each test can bound it from outside (an outer cgroup as root,
a user namespace with RLIMIT_NPROC as nobody), and so it really is "the executor": its own
cgroups, uid and rlimits are what the code under test sees. Commands go through `start()` or
`run()` like any harness's; nothing here spawns them another way.

What it checks from outside the command, while the command still runs (the executor
releases a command's cgroup as soon as it settles): the command's processes in /proc, their
cgroups and the kernel counters there, their open descriptors, the private tmpfs roots seen
through `/proc/<pid>/root`. A command that must be observed mid-run blocks on a fifo in the
workspace (`Hold`) after printing a marker, and ends when the driver closes the fifo.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.linux.cgroups import read_text
from bash_seam import BashExecRequest, BashProcess, BashRunResult, SandboxFacts
from policies import ResourceLimits

Scenario = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
SCENARIOS: dict[str, Scenario] = {}
MARKER = "HOLDING"
# Kernel counters of a command's cgroups (v1 and v2 names), read while it runs.
COUNTER_FILES = {
    "pids": ("pids.current", "pids.peak", "pids.max", "pids.events"),
    "memory": (
        "memory.usage_in_bytes",
        "memory.max_usage_in_bytes",
        "memory.limit_in_bytes",
        "memory.oom_control",
        "memory.current",
        "memory.peak",
        "memory.max",
        "memory.events",
    ),
    "cpu": ("cpu.stat", "cpu.cfs_quota_us", "cpu.max"),
}


def scenario(func: Scenario) -> Scenario:
    SCENARIOS[func.__name__] = func
    return func


# -- the executor under test ------------------------------------------------------------


def executor(params: dict[str, Any], limits: dict[str, Any] | None = None) -> SandboxBashExecutor:
    """A real executor of the scenario's backend, mode and workspace."""
    return SandboxBashExecutor(
        backend=params["backend"],
        mode=params.get("mode", "workspace-write"),
        workspace_root=params["workspace"],
        limits=ResourceLimits(**(params.get("limits", {}) if limits is None else limits)),
    )


def request(command: str, timeout_s: float = 120, **fields: Any) -> BashExecRequest:
    # The commands' Python finds this driver's packages the way the driver does.
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None
    return BashExecRequest(command=command, timeout_ms=int(timeout_s * 1000), env=env, **fields)


def facts(sandbox: SandboxFacts | None) -> dict[str, Any] | None:
    return None if sandbox is None else sandbox.model_dump(mode="json")


def run_result(result: BashRunResult) -> dict[str, Any]:
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "stdout": result.stdout.text,
        "stderr": result.stderr.text[-4000:],
        "sandbox": facts(result.sandbox),
    }


def own_cgroups() -> list[str]:
    """Every cgroup named after this process (the executors' parents), anywhere."""
    prefix = f"bash-sandbox-{os.getpid()}-"
    return [
        os.path.join(dirpath, name)
        for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup")
        for name in dirnames
        if name.startswith(prefix)
    ]


# -- holding a command and watching its output ------------------------------------------


class Hold:
    """A fifo in the workspace that a command blocks on (reading it) until `release()`."""

    def __init__(self, workspace: str, token: str) -> None:
        self.path = os.path.join(workspace, f"hold-{token}")
        os.mkfifo(self.path, 0o666)
        os.chmod(self.path, 0o666)
        # Reader and writer in one descriptor: opening never blocks, and closing the only
        # writer is what gives every reader its EOF.
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)

    def shell(self, marker: str) -> str:
        """Shell words that open the fifo, then print ``marker``, then block until the
        release (and succeed): once the marker is out, a release cannot come too early."""
        return f"{{ echo {marker}; cat > /dev/null; }} < {self.path}"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Watch:
    """An output listener for `start()`: keeps both streams and wakes whoever waits."""

    def __init__(self) -> None:
        self.streams = {"stdout": bytearray(), "stderr": bytearray()}
        self._changed = asyncio.Event()

    def __call__(self, stream: str, data: bytes) -> None:
        self.streams[stream] += data
        self._changed.set()

    def text(self, stream: str) -> str:
        return self.streams[stream].decode(errors="replace")

    async def until(
        self, done: Callable[[bytes], bool], process: BashProcess, timeout_s: float = 60
    ) -> None:
        """Until ``done(stdout)``; fails at once if the command ends first."""
        ended = asyncio.ensure_future(process.wait())
        try:
            async with asyncio.timeout(timeout_s):
                while not done(bytes(self.streams["stdout"])):
                    if ended.done():
                        raise AssertionError(
                            f"the command ended early: {self.text('stdout')[-1000:]}"
                            f"{self.text('stderr')[-2000:]}"
                        )
                    self._changed.clear()
                    changed = asyncio.ensure_future(self._changed.wait())
                    await asyncio.wait({changed, ended}, return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
        finally:
            ended.cancel()

    async def until_seen(self, marker: str, process: BashProcess) -> None:
        await self.until(lambda out: marker.encode() in out, process)


def process_result(process: BashProcess, watch: Watch) -> dict[str, Any]:
    return {
        "status": process.status,
        "exit_code": process.exit_code,
        "signal": process.signal,
        "stdout": watch.text("stdout")[-8000:],
        "stderr": watch.text("stderr")[-4000:],
        "sandbox": facts(process.sandbox),
    }


# -- looking from outside ----------------------------------------------------------------


def argv_of(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0")[:-1]]
    except OSError:
        return None


def pids_with(token: str) -> list[int]:
    """Processes with ``token`` in an argument: the command's bash, its wrapper and
    whatever runs a script naming it."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != str(os.getpid()):
            argv = argv_of(int(entry))
            if argv and any(token in a for a in argv):
                found.append(int(entry))
    return found


def count_program(program: str, token: str) -> int:
    """Processes executing ``program`` with ``token`` as an argument; a wrapper whose
    argv merely contains them (bwrap, a shell) is not counted."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = argv_of(int(entry))
            if argv and argv[0] == program and token in argv[1:]:
                count += 1
    return count


def running(pid: int) -> bool:
    """The process exists and is not a zombie (dead, only waiting for its reaper)."""
    stat = read_text(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(")", 1)[1].split()[0] != "Z"


def cgroups_of(pid: int, proc: str | None = None) -> dict[str, str]:
    """The command's cgroup directories of ``pid`` (those an executor made), by controller."""
    return cgroups_in(read_text(f"{proc or f'/proc/{pid}'}/cgroup") or "")


def cgroups_in(text: str) -> dict[str, str]:
    """`cgroups_of` from the text of a /proc/<pid>/cgroup."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "/bash-sandbox-" not in path:
            continue
        if controllers == "":  # cgroup v2: one tree
            for c in ("memory", "pids", "cpu"):
                out.setdefault(c, f"/sys/fs/cgroup{path}")
        for c in controllers.split(","):
            if c in COUNTER_FILES and os.path.isdir(f"/sys/fs/cgroup/{c}"):
                out[c] = f"/sys/fs/cgroup/{c}{path}"
    return out


def thread_cgroups(pid: int) -> list[dict[str, str]]:
    """`cgroups_of` each thread of ``pid``: on v1 a thread can sit in another cgroup than
    its process's leader."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [cgroups_of(int(tid), f"/proc/{pid}/task/{tid}") for tid in tids]


def tmpfs_of(pid: int, path: str) -> dict[str, int] | None:
    """Size and free bytes of ``path`` as the process sees it (its root, its mounts)."""
    try:
        st = os.statvfs(f"/proc/{pid}/root{path}")
    except OSError:
        return None
    return {
        "size": st.f_blocks * st.f_frsize,
        "free": st.f_bavail * st.f_frsize,
        "inodes": st.f_files,
        "free_inodes": st.f_favail,
    }


def cpu_of(pid: int) -> dict[str, float] | None:
    """CPU seconds of the process itself and of its children it has reaped."""
    stat = read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    # Fields 14-17 of proc(5), counted from the state (field 3) here.
    utime, stime, cutime, cstime = (int(f) / tick for f in fields[11:15])
    return {"self": utime + stime, "children": cutime + cstime}


def is_command_shell(argv: list[str], token: str) -> bool:
    """The command's own `bash -c COMMAND`, not a wrapper (bwrap, the PID 1 bash)."""
    return (
        len(argv) >= 3
        and os.path.basename(argv[0]) == "bash"
        and argv[1] == "-c"
        and token in argv[2]
    )


def observe(token: str, exact: str | None = None) -> dict[str, Any]:
    """The command's processes and cgroups, seen from here while it runs."""
    pids = pids_with(token)
    cgroups: dict[str, str] = {}
    for pid in pids:
        cgroups.update(cgroups_of(pid))
    counters = {
        name: text
        for c, d in cgroups.items()
        for name in COUNTER_FILES[c]
        if (text := read_text(os.path.join(d, name))) is not None
    }
    procs = {}
    for pid in pids:
        argv = argv_of(pid) or []
        try:
            fds: int | None = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            fds = None
        try:
            sid: int | None = os.getsid(pid)
        except OSError:
            sid = None
        procs[str(pid)] = {
            "argv": argv,
            "fds": fds,
            "sid": sid,
            "exact": exact in argv,
            "thread_cgroups": thread_cgroups(pid),
        }
    shell = next((p for p in pids if is_command_shell(procs[str(p)]["argv"], token)), None)
    return {
        "procs": procs,
        "cgroups": cgroups,
        "counters": counters,
        "shell": shell,
        # What the command's shell sees at /tmp and /dev/shm, and the CPU its reaped
        # children used.
        "tmpfs": {w: tmpfs_of(shell, w) if shell else None for w in ("/tmp", "/dev/shm")},
        "shell_cpu": cpu_of(shell) if shell else None,
    }


# -- scenarios ---------------------------------------------------------------------------


def expand(template: str, params: dict[str, Any], **more: str) -> str:
    return template.format(python=sys.executable, **params.get("programs", {}), **more)


@scenario
async def held(params: dict[str, Any]) -> dict[str, Any]:
    """Each step on a fresh executor: start the command, wait for its marker, look at it
    from outside (optionally while this process allocates), let it end, check it is gone."""
    steps = []
    for n, step in enumerate(params["steps"]):
        token = f"{params['token']}-{n}"
        hold = Hold(params["workspace"], token)
        watch = Watch()
        marker = f"{MARKER}-{token}"
        # A command holds with `{hold}`, or opens `{fifo}` itself before it prints `{marker}`.
        fields = {"hold": hold.shell(marker), "fifo": hold.path, "marker": marker, "token": token}
        command = expand(step["command"], params, **fields)
        exact = expand(step["exact"], params, **fields) if "exact" in step else None
        own_cgroup, own_limits = read_text("/proc/self/cgroup"), read_text("/proc/self/limits")
        ex = executor({**params, **step}, step.get("limits"))
        try:
            process = await ex.start(ex.resolve(request(command)), on_output=watch)
            started = time.monotonic()
            await watch.until_seen(marker, process)
            held_s = time.monotonic() - started
            ballast = None
            if step.get("executor_allocates_mb"):
                # The executor allocates (and touches) far past the command's limit.
                ballast = bytearray(step["executor_allocates_mb"] << 20)
                for i in range(0, len(ballast), 4096):
                    ballast[i] = 1
            seen = observe(token, exact)
            del ballast
            hold.release()
            await process.wait()
        finally:
            hold.release()
            await ex.aclose()
        steps.append(
            {
                **process_result(process, watch),
                "seen": seen,
                "held_seconds": held_s,
                "alive_after": [int(p) for p in seen["procs"] if running(int(p))],
                "cgroups_after": [d for d in seen["cgroups"].values() if os.path.exists(d)],
                "own_cgroup_unchanged": read_text("/proc/self/cgroup") == own_cgroup,
                "own_limits_unchanged": read_text("/proc/self/limits") == own_limits,
                "left_after_close": own_cgroups(),
            }
        )
    return {"steps": steps, "left_after_close": own_cgroups()}


@scenario
async def run(params: dict[str, Any]) -> dict[str, Any]:
    """One command through `run()`."""
    ex = executor(params)
    try:
        result = await ex.run(ex.resolve(request(expand(params["command"], params))))
    finally:
        await ex.aclose()
    return {**run_result(result), "left_after_close": own_cgroups()}


def tree_complete(out: bytes) -> bool:
    """The fork bomb's progress bytes account for every fork attempt (see forkbomb.c)."""
    outstanding = 1
    for byte in out:
        outstanding -= 1
        if byte > ord("a"):  # a node above the leaves: two fork attempts to come
            outstanding += 2
    return outstanding <= 0


async def start_bomb(
    ex: SandboxBashExecutor, params: dict[str, Any], hold: Hold, watch: Watch
) -> BashProcess:
    """The bounded fork bomb, holding on the fifo, its progress bytes on stdout."""
    bomb = params["programs"]["forkbomb"]
    command = f"{bomb} {params.get('depth', 13)} {params['token']} < {hold.path} 3>&1"
    process = await ex.start(ex.resolve(request(command)), on_output=watch)
    await watch.until(tree_complete, process)
    return process


@scenario
async def forkbomb(params: dict[str, Any]) -> dict[str, Any]:
    ex = executor(params)
    hold, watch = Hold(params["workspace"], params["token"]), Watch()
    try:
        process = await start_bomb(ex, params, hold, watch)
        observed = count_program(params["programs"]["forkbomb"], params["token"])
        seen = observe(params["token"])
        hold.release()
        await process.wait()
    finally:
        hold.release()
        await ex.aclose()
    return {
        **process_result(process, watch),
        "failed_forks": watch.streams["stdout"].count(b"F"),
        "observed": observed,
        "seen": seen,
        "after": count_program(params["programs"]["forkbomb"], params["token"]),
        "cgroups_after": [d for d in seen["cgroups"].values() if os.path.exists(d)],
        "left_after_close": own_cgroups(),
    }


@scenario
async def concurrent(params: dict[str, Any]) -> dict[str, Any]:
    """A fork bomb held at its limit in one command while a command of the same executor
    (its own limits, a per-call policy) and one of another executor fork 40 children."""
    first = executor(params, {"processes": params["bomb_processes"]})
    second = executor(params, {"processes": params["probe_processes"]})
    hold, watch = Hold(params["workspace"], params["token"]), Watch()
    probe = f"{params['programs']['forkcount']} {params['probe_forks']}"
    try:
        bomb = await start_bomb(first, params, hold, watch)
        spec = first.resolve(request(probe))
        assert spec.sandbox_policy is not None
        policy = spec.sandbox_policy.model_copy(
            update={"limits": ResourceLimits(processes=params["probe_processes"])}
        )
        same = await first.run(first.resolve(request(probe, sandbox_policy=policy)))
        other = await second.run(second.resolve(request(probe)))
        hold.release()
        await bomb.wait()
    finally:
        hold.release()
        await first.aclose()
        await second.aclose()
    return {
        "bomb": process_result(bomb, watch),
        "same_executor": run_result(same),
        "other_executor": run_result(other),
        "left_after_close": own_cgroups(),
    }


@scenario
async def abandon(params: dict[str, Any]) -> dict[str, Any]:
    """Start a command, print its cgroups, then die without aclose() (SIGKILL, as a crash)."""
    ex = executor(params)
    hold, watch = Hold(params["workspace"], params["token"]), Watch()
    marker = f"{MARKER}-{params['token']}"
    process = await ex.start(ex.resolve(request(hold.shell(marker))), on_output=watch)
    await watch.until_seen(marker, process)
    seen = observe(params["token"])
    parents = sorted(own_cgroups())
    print(json.dumps({"seen": seen, "parents": parents}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


@scenario
async def sweep(params: dict[str, Any]) -> dict[str, Any]:
    """A fresh executor's first command: its limits' first prepare removes dead parents."""
    ex = executor(params)
    try:
        result = await ex.run(ex.resolve(request("true")))
    finally:
        await ex.aclose()
    return {**run_result(result), "left_after_close": own_cgroups()}


@scenario
async def slots(params: dict[str, Any]) -> dict[str, Any]:
    """One executor's commands in turn, and after each (from outside, once it settled) the
    command cgroups left below the executor's parents, with what is in them; after the
    steps in ``remove_after``, those cgroups are removed from outside."""
    ex = executor(params)
    steps = []
    try:
        for n, command in enumerate(params["commands"]):
            result = await ex.run(ex.resolve(request(expand(command, params))))
            left = {
                parent: {
                    name: {
                        "tasks": read_text(os.path.join(parent, name, "tasks")),
                        "pids.max": read_text(os.path.join(parent, name, "pids.max")),
                    }
                    for name in sorted(os.listdir(parent))
                    if os.path.isdir(os.path.join(parent, name))
                }
                for parent in own_cgroups()
            }
            steps.append({**run_result(result), "left": left})
            if n in params.get("remove_after", ()):
                # Root removes the kept cgroups behind the executor's back.
                for parent, children in left.items():
                    for name in children:
                        os.rmdir(os.path.join(parent, name))
    finally:
        await ex.aclose()
    return {"steps": steps, "left_after_close": own_cgroups()}


async def main() -> None:
    params = json.loads(sys.stdin.read())
    result = await SCENARIOS[params["scenario"]](params)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
