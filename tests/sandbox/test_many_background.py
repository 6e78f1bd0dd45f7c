"""A hundred confined background commands at once on one executor: every one completes,
each in its own confinement, and after `aclose()` the executor holds no descriptor, thread or
process more than before it was made."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from pathlib import Path

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

COMMANDS = 100


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` (from /proc, by parent pid)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _fds() -> set[str]:
    return {f"{fd}:{os.readlink(f'/proc/self/fd/{fd}')}" for fd in _fd_numbers()}


def _fd_numbers() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor
        out.append(fd)
    return out


def _ours(before: set[int | None]) -> list[str]:
    """Threads started since ``before``, but the loop's own default pool: it grows when
    several calls wait in it at once on a loaded machine (`asyncio_1`) and its idle workers
    live as long as the loop, whatever any executor does."""
    return [
        t.name
        for t in threading.enumerate()
        if t.ident not in before and not t.name.startswith("asyncio_")
    ]


async def test_a_hundred_background_commands_at_once_complete_and_leave_nothing_behind(
    backend: str, workspace: Path
) -> None:
    await asyncio.to_thread(int)  # the loop's own worker thread, which outlives any executor
    # What earlier tests of this worker dropped is collected now, not during this one (their
    # descriptors closing meanwhile would look like this executor's doing).
    gc.collect()
    fds_before = _fds()
    threads_before = {t.ident for t in threading.enumerate()}
    children_before = _descendants(os.getpid())
    ex = SandboxBashExecutor(
        backend=backend, workspace_root=str(workspace), mode="workspace-write", grace_ms=500
    )
    # Each command blocks on a FIFO until all have started, so all hundred are alive at once
    # (and idle: no polling loop competes with the spawns for the two cores).
    gate = workspace / "go"
    os.mkfifo(gate)
    command = "echo $$ > started-{n}; : < go; echo {n} > out-{n}"
    procs = []
    for n in range(COMMANDS):
        spec = ex.resolve(BashExecRequest(command=command.format(n=n), workdir=str(workspace)))
        procs.append(await ex.start(spec))
    started = [workspace / f"started-{n}" for n in range(COMMANDS)]
    for _ in range(1200):
        if all(p.exists() and p.stat().st_size for p in started):
            break
        await asyncio.sleep(0.05)
    assert all(p.exists() for p in started), "not all commands were running at once"
    live = _descendants(os.getpid()) - children_before
    assert len(live) >= COMMANDS  # a hundred confined trees, at least one process each
    # Readers are waiting, so a non-blocking open for writing succeeds; held open until all
    # are through, so none can miss it.
    writer = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    try:
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout=120)
    finally:
        os.close(writer)
    ended = [(p.status, p.exit_code, p.signal) for p in procs]
    odd = [
        (n, *ended[n], p.sandbox.warnings if p.sandbox else None, p.read_output().delta[-300:])
        for n, p in enumerate(procs)
        if p.exit_code != 0
    ]
    assert odd == [], odd[:3]
    for n in range(COMMANDS):
        assert (workspace / f"out-{n}").read_text() == f"{n}\n"
    assert all(p.sandbox is not None and p.sandbox.backend == backend for p in procs)
    # Every command had a PID namespace of its own: each saw itself as a small pid.
    pids = {int((workspace / f"started-{n}").read_text()) for n in range(COMMANDS)}
    assert max(pids) < 10
    await ex.aclose()
    assert _descendants(os.getpid()) - children_before == set()
    assert _fds() == fds_before
    for _ in range(100):  # worker threads end right after aclose() returns
        if not _ours(threads_before):
            break
        await asyncio.sleep(0.05)
    assert _ours(threads_before) == []
