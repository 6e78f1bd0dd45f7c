"""The spawn helper (`SandboxBashConfig.spawn_helper`, `linux/spawn_helper.py`), for real.

Every judgement is made from outside the sandbox: the host's /proc (who is whose parent,
which processes are left), files the command tried to write. The whole confinement suite
runs on the helper path with ``BASH_SANDBOX_TEST_SPAWN_HELPER=1`` (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_local.spawn import LaunchedChild, SpawnPlan
from bash_sandbox.backends.base import BackendContext, SandboxBackend
from bash_sandbox.backends.bwrap import BwrapBackend
from bash_sandbox.backends.child_failure import read_child_failure
from bash_sandbox.backends.landlock import LandlockBackend
from bash_sandbox.backends.linux_child import probe_context
from bash_sandbox.linux import compiled_child, sandbox_init
from bash_sandbox.linux.child_setup import ChildSetup, ReplayCache
from bash_sandbox.linux.helper_client import SpawnHelper
from bash_seam import BashExecRequest
from policies import NetworkMode, SandboxMode, SandboxPolicy
from tests.sandbox.conftest import (
    ExecutorFactory,
    assert_closed_or_killed,
    processes_naming,
    require_backend,
    sleep_token,
)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found |= {int(p) for p in fh.read().split()}
    return found


def _state(pid: int) -> str | None:
    """The process state letter (``Z`` for a zombie), None once the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie, or a pid gone, counts as dead)."""
    return _state(pid) not in (None, "Z", "X")


def _gone_eventually(pid: int, parent: int) -> bool:
    """The helper reaps on the executor's word, a moment after the run settled."""
    deadline = time.monotonic() + 30  # a loaded CI machine; returns as soon as it holds
    while pid in _children(parent) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid not in _children(parent)


async def test_commands_are_children_of_the_helper_and_confined(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    ex = make_executor(mode="workspace-write", spawn_helper=True)
    outside = tmp_path / "outside"
    result = await ex.run(
        ex.resolve(
            BashExecRequest(
                command=f"echo in > inside; echo out > {outside}; exit 3", workdir=str(workspace)
            )
        )
    )
    assert result.exit_code == 3
    assert (workspace / "inside").read_text() == "in\n"
    assert not outside.exists()
    assert result.sandbox is not None and result.sandbox.denied
    helper = ex._services.spawn_helper()
    assert helper is not None
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 30")))
    spawned = process._spawned  # type: ignore[attr-defined]
    assert spawned is not None
    # The harness forked nothing: the command's leader is the helper's child.
    assert _ppid(spawned.pid) == helper.pid
    assert os.getpgid(spawned.pid) == spawned.pid
    assert process.kill()
    await process.wait()
    # Settled: reaped by the helper on the executor's word, nothing left behind.
    assert _gone_eventually(spawned.pid, helper.pid)


async def test_every_group_kill_finds_the_leader_unreaped(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # pid == pgid is safe to signal only while the leader is not reaped (a reaped pid can be
    # reused): the helper keeps it a zombie until the executor has sent its last killpg.
    ex = make_executor(spawn_helper=True)
    seen: list[tuple[int, str | None]] = []
    original = ex._kill_group

    def kill_group(pid: int, sig: int) -> None:
        seen.append((sig, _state(pid)))
        original(pid, sig)

    ex._kill_group = kill_group  # type: ignore[method-assign]
    for command in ("exit 0", "sleep 20 & exit 7"):
        await ex.run(ex.resolve(BashExecRequest(command=command, timeout_ms=20_000)))
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 30")))
    process.kill()
    await process.wait()
    assert len(seen) >= 4
    assert all(state is not None for _, state in seen), seen
    assert (signal.SIGKILL, "Z") in seen  # the final kill of an exited leader


@contextlib.contextmanager
def _probe_workspace(name: str) -> Iterator[tuple[SandboxBackend, SandboxPolicy, BackendContext]]:
    """Backend ``name``, a workspace-write policy on a fresh workspace, and a context shaped
    like an executor's (its namespaces too), as the backends' probes make them."""
    require_backend(name)
    backend: SandboxBackend = BwrapBackend() if name == "bwrap" else LandlockBackend()
    with probe_context(True) as (tmp, ctx):
        ws = os.path.join(tmp, "ws")
        os.mkdir(ws)
        policy = SandboxPolicy(
            mode=SandboxMode.WORKSPACE_WRITE, workspace_root=ws, network=NetworkMode.ISOLATED
        )
        yield backend, policy, ctx


@contextlib.contextmanager
def _true_setup(
    backend: SandboxBackend, policy: SandboxPolicy, ctx: BackendContext, *, record_only: bool
) -> Iterator[ChildSetup]:
    """The child setup ``backend`` plans for `/bin/true` (``record_only``: as for the spawn
    helper, which first holds the compiled init); the plan is released afterwards."""
    if record_only:
        ctx = dataclasses.replace(ctx, record_only=True, hold_init=True)
    cwd = str(policy.workspace_root)
    plan = backend.wrap(policy, SpawnPlan(argv=("/bin/true",), env={}, cwd=cwd), ctx)
    try:
        assert isinstance(plan.preexec_fn, ChildSetup)
        yield plan.preexec_fn
    finally:
        if plan.release is not None:
            plan.release()


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_replayed_steps_are_the_same_steps(name: str) -> None:
    """What the helper replays (the recorded calls) yields exactly the harness's steps."""
    with (
        _probe_workspace(name) as (backend, policy, ctx),
        _true_setup(backend, policy, ctx, record_only=False) as setup,
    ):
        replay = ChildSetup()
        for method, args, kwargs in setup.calls():
            getattr(replay, method)(*args, **kwargs)
        assert len(setup.step_names()) > 20
        assert replay.step_names() == setup.step_names()
        # Where the helper spawns, the harness records the calls and builds no step.
        with _true_setup(backend, policy, ctx, record_only=True) as only:
            assert only.step_names() == ()
            calls, steps = [c[0] for c in only.calls()], only.materialized().step_names()
            if sandbox_init.built() is not None:
                # A child of the helper (or the executor's compiled child) first holds
                # the compiled init (Landlock's PID 1, and on both backends what the
                # waiter execs); a child `Popen` forks waits as it is.
                assert (calls[0], steps[0]) == ("hold_file", f"hold {sandbox_init.built()}")
                calls, steps = calls[1:], steps[1:]
            assert calls == [c[0] for c in setup.calls()]
            assert steps == setup.step_names()
            # The waiter execs that init only where it was held.
            waits = [c[1] for c in only.calls() if c[0] == "fork_waiter"]
            held = sandbox_init.INIT_FD if sandbox_init.built() is not None else -1
            assert waits == [(held,)]
            assert [c[1] for c in setup.calls() if c[0] == "fork_waiter"] == [(-1,)]


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_the_helpers_replay_cache_builds_the_same_steps_and_reuses_the_unchanged(
    name: str,
) -> None:
    """The helper's `ReplayCache`: a replay yields exactly a fresh replay's steps; the next
    replay of the same calls reuses every step object, place by place; a call that changed
    in place (a spawn's own cgroup path) is built afresh from its new arguments, the rest
    reused."""
    with (
        _probe_workspace(name) as (backend, policy, ctx),
        _true_setup(backend, policy, ctx, record_only=True) as only,
    ):
        calls = only.calls()
        fresh = ChildSetup.replay(calls, 7)
        cache = ReplayCache()
        first, _ = cache.replay(calls, 7)
        assert first.step_names() == fresh.step_names() and len(calls) > 20
        assert first.calls() == fresh.calls() and first.report_fd == 7
        assert len(first._keep) == len(fresh._keep)
        again, _ = cache.replay(calls, 9)
        assert again.report_fd == 9
        # Nothing built again: the very step objects, in the same places.
        assert again.step_names() == first.step_names()
        assert all(a is b for a, b in zip(again._steps, first._steps, strict=True))
        # One call changes in place, as a spawn's cgroup path does: built afresh from
        # its new argument, every other call's steps reused.
        moved = os.path.join(os.path.dirname(str(policy.workspace_root)), "elsewhere")
        at = next(i for i, c in enumerate(calls) if c[0] == "make_dir")
        changed = (*calls[:at], ("make_dir", (moved,), {}), *calls[at + 1 :])
        third, _ = cache.replay(changed, 9)
        names = list(fresh.step_names())
        index = names.index(f"mkdir {calls[at][1][0]}")
        names[index] = f"mkdir {moved}"
        assert third.step_names() == tuple(names)
        assert third._steps[index] not in again._steps
        others = third._steps[:index] + third._steps[index + 1 :]
        assert {id(s) for s in others} <= {id(s) for s in again._steps}
        # Calls shifted by one (a call more at the start): all built, still the same.
        shifted, _ = cache.replay((("make_dir", (moved,), {}), *calls), 9)
        assert shifted.step_names() == (f"mkdir {moved}", *fresh.step_names())
        assert shifted.calls() == (("make_dir", (moved,), {}), *calls)


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_the_replay_cache_keeps_each_calls_packed_steps_equal_to_packing_afresh(
    name: str,
) -> None:
    """With the compiled child's packer, a replay's packed steps are byte for byte what
    packing its setup afresh gives (the same operations, arguments, errnos and name
    addresses), on the first replay, on a replay reusing every call and on one with a call
    changed in place; a step the compiled child has no form for leaves no packed form (the
    helper then forks its Python child)."""
    pack = compiled_child.pack_steps
    with (
        _probe_workspace(name) as (backend, policy, ctx),
        _true_setup(backend, policy, ctx, record_only=True) as only,
    ):
        calls = only.calls()
        cache = ReplayCache(pack)
        first, packed = cache.replay(calls, 7)
        assert packed is not None and packed == pack(first.native_steps())
        assert len(packed) == len(first.native_steps()) * ctypes.sizeof(compiled_child.Step)
        again, packed_again = cache.replay(calls, 7)
        assert packed_again == packed and packed_again == pack(again.native_steps())
        at = next(i for i, c in enumerate(calls) if c[0] == "make_dir")
        moved = os.path.join(os.path.dirname(str(policy.workspace_root)), "elsewhere")
        changed = (*calls[:at], ("make_dir", (moved,), {}), *calls[at + 1 :])
        third, packed_third = cache.replay(changed, 7)
        assert packed_third is not None and packed_third != packed
        assert packed_third == pack(third.native_steps())
        # Without a packer: steps only.
        assert ReplayCache().replay(calls, 7)[1] is None

    def refuse(steps: object) -> bytes:
        raise TypeError("no compiled form")

    setup_calls = (("chdir", ("/",), {}),)
    assert ReplayCache(refuse).replay(setup_calls, 7)[1] is None


async def test_a_failed_step_reports_errno_and_step(tmp_path: Path) -> None:
    helper = SpawnHelper()
    report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    out_r, out_w = os.pipe()
    try:
        setup = ChildSetup()
        setup.chdir(str(tmp_path / "missing"))
        setup.report_failures_to(report_w)
        plan = SpawnPlan(argv=("/bin/true",), env={}, cwd=str(tmp_path), preexec_fn=setup)
        with pytest.raises(subprocess.SubprocessError):
            helper.launch(plan, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
        failure = read_child_failure(report_r)
        assert failure is not None
        assert (failure.step, failure.errno) == (f"chdir {tmp_path}/missing", errno.ENOENT)
        # An exec failure is the OSError Popen raises, naming the program.
        plan = SpawnPlan(argv=(str(tmp_path / "nope"),), env={}, cwd=str(tmp_path))
        plan = SpawnPlan(argv=plan.argv, env={}, cwd=plan.cwd, preexec_fn=ChildSetup())
        with pytest.raises(FileNotFoundError) as caught:
            helper.launch(plan, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
        assert caught.value.filename == str(tmp_path / "nope")
        assert _children(helper.pid) == set()  # failed children are reaped at once
    finally:
        helper.close()
        for fd in (report_r, report_w, out_r, out_w):
            os.close(fd)
    assert not _alive(helper.pid)


async def test_fallback_when_the_helper_cannot_start(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    ex = make_executor(mode="workspace-write", spawn_helper=True)
    ex._services.helper_python = str(tmp_path / "no-python")
    outside = tmp_path / "outside"
    result = await ex.run(
        ex.resolve(
            BashExecRequest(
                command=f"echo in > inside; echo out > {outside}", workdir=str(workspace)
            )
        )
    )
    assert (workspace / "inside").read_text() == "in\n"
    assert not outside.exists()
    assert result.sandbox is not None
    assert any("spawn helper could not be started" in w for w in result.sandbox.warnings)
    assert ex._services.spawn_helper() is None
    # Spawned from the executor itself, as without the switch.
    process = await ex.start(ex.resolve(BashExecRequest(command="sleep 30")))
    spawned = process._spawned  # type: ignore[attr-defined]
    assert spawned is not None and _ppid(spawned.pid) == os.getpid()
    process.kill()
    await process.wait()


async def test_aclose_ends_the_helper(make_executor: ExecutorFactory) -> None:
    ex = make_executor(spawn_helper=True)
    await ex.start(ex.resolve(BashExecRequest(command="sleep 30")))
    helper = ex._services.spawn_helper()
    assert helper is not None and _alive(helper.pid)
    await ex.aclose()
    assert not _alive(helper.pid)


_HARNESS = textwrap.dedent(
    """
    import asyncio, sys
    from bash_sandbox import SandboxBashExecutor
    from bash_seam import BashExecRequest

    async def main():
        ex = SandboxBashExecutor(backend=sys.argv[1], spawn_helper=True)
        process = await ex.start(ex.resolve(BashExecRequest(command="sleep 300")))
        helper = ex._services.spawn_helper()
        print(helper.pid, process._spawned.pid, flush=True)
        await asyncio.sleep(300)

    asyncio.run(main())
    """
)


def test_helper_and_commands_die_with_a_killed_harness(backend: str) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, backend], stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert harness.stdout is not None
        pids = [int(p) for p in harness.stdout.readline().split()]
        assert len(pids) == 2, "the harness did not start its command"
        helper, command = pids
        assert _alive(helper) and _alive(command)
        harness.kill()  # SIGKILL: no aclose, no finalizer
        harness.wait()
        deadline = time.monotonic() + 10
        while (_alive(helper) or _alive(command)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper), "the helper outlived its executor"
        assert not _alive(command), "the command outlived its executor"
    finally:
        harness.kill()
        harness.wait()
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def test_a_cancelled_launch_leaves_nothing_running(tmp_path: Path) -> None:
    helper = SpawnHelper()
    out_r, out_w = os.pipe()
    token = f"3{os.getpid() % 1000}.5"  # sleep's argument, unique to this test run
    answers: list[object] = []
    abandon = helper._dispatch_abandoned

    def record(seq: int) -> None:
        answers.append(helper._pending.get(seq))
        abandon(seq)

    helper._dispatch_abandoned = record  # type: ignore[method-assign]
    try:
        plan = SpawnPlan(
            argv=("/bin/sleep", token), env={}, cwd=str(tmp_path), preexec_fn=ChildSetup()
        )
        task = asyncio.create_task(
            helper.launch_async(plan, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w)
        )
        await asyncio.sleep(0)  # the request is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while (not answers or _children(helper.pid)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # It was started, then killed and reaped: the helper has no child left.
        assert answers and isinstance(answers[0], tuple) and answers[0][0] == "started"
        assert _children(helper.pid) == set()
    finally:
        helper.close()
        os.close(out_r)
        os.close(out_w)


async def test_a_run_cancelled_just_as_it_starts_ends(make_executor: ExecutorFactory) -> None:
    # The cancellation arrives together with the helper's answer: it must still cancel the
    # run (and its command), not be swallowed while the command goes on.
    ex = make_executor(spawn_helper=True)
    helper = ex._services.spawn_helper()
    assert helper is not None
    task: asyncio.Future[object] | None = None
    dispatch = helper._dispatch

    def answer_then_cancel(message: tuple[object, ...]) -> None:
        dispatch(message)
        if message[0] == "started" and task is not None:
            task.cancel()

    helper._dispatch = answer_then_cancel  # type: ignore[method-assign]
    task = asyncio.ensure_future(ex.run(ex.resolve(BashExecRequest(command="sleep 100"))))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)  # a swallowed cancellation: TimeoutError here
    deadline = time.monotonic() + 10
    while _children(helper.pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _children(helper.pid) == set()  # killed and reaped


async def test_a_child_slow_to_set_up_holds_no_other_spawn_back(tmp_path: Path) -> None:
    """The helper answers each spawn when its child has exec'd and serves the next request
    meanwhile: a child blocked in a step (opening a fifo nobody reads) delays only itself.
    And one still setting up when the executor goes dies with the helper."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out_r, out_w = os.pipe()

    def plan(argv: tuple[str, ...], setup: ChildSetup) -> SpawnPlan:
        return SpawnPlan(argv=argv, env={}, cwd=str(tmp_path), preexec_fn=setup)

    async def status(child: LaunchedChild) -> int:
        ended = asyncio.get_running_loop().create_future()
        child.on_exit(lambda: ended.set_result(None))
        await asyncio.wait_for(ended, 30)
        return child.wait()

    for reader in (True, False):
        helper = SpawnHelper()
        try:
            blocked = ChildSetup()
            blocked.write_file(str(fifo), b"set up\n")  # open(O_WRONLY) waits for a reader
            slow = asyncio.create_task(
                helper.launch_async(
                    plan(("/bin/true",), blocked), stdin=-1, stdout=out_w, stderr=out_w
                )
            )
            fast = await helper.launch_async(
                plan(("/bin/true",), ChildSetup()), stdin=-1, stdout=out_w, stderr=out_w
            )
            assert await status(fast) == 0
            assert not slow.done()  # still in its step, yet the other spawn ran and ended
            if reader:
                with open(fifo, "rb") as fh:  # now its step completes, then it execs
                    assert fh.read() == b"set up\n"
                assert await status(await slow) == 0
                continue
            # The slow request may reach the helper after the fast one ran: its child is
            # forked then (a loaded CI machine's nobody leg looked before it was).
            setting_up: set[int] = set()
            for _ in range(200):
                setting_up = _children(helper.pid) - {fast.pid}
                if setting_up:
                    break
                await asyncio.sleep(0.025)
            (pid,) = setting_up
            helper.close()  # end of file while the child sets up: killed and reaped
            assert not _alive(pid)
            with pytest.raises((subprocess.SubprocessError, asyncio.CancelledError)):
                await slow
        finally:
            helper.close()
            # Whatever happened: a writer still blocked on the fifo gets its reader and ends.
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    os.close(out_r)
    os.close(out_w)


async def test_aclose_while_commands_are_being_set_up_leaves_nothing(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    """The harness closes while several commands are still being set up by the helper's
    children (its answers come as each child execs): every run ends, and no child, set up
    or not, outlives the executor."""
    ex = make_executor(mode="workspace-write", spawn_helper=True)
    assert (await ex.run(ex.resolve(BashExecRequest(command="true")))).exit_code == 0
    helper = ex._services.spawn_helper()
    assert helper is not None
    token = sleep_token()
    request = BashExecRequest(command=f"sleep {token}", workdir=str(workspace))
    runs = [asyncio.create_task(ex.run(ex.resolve(request))) for _ in range(4)]
    # Until the helper has children: some requests are mid-setup, some not even sent.
    deadline = time.monotonic() + 30
    while not _children(helper.pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    children = _children(helper.pid)
    assert children, "no spawn reached the helper"
    await ex.aclose()
    assert_closed_or_killed(
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 60)
    )
    # Judged from /proc: the children as they were (exec'd or not), and any command of
    # this run by its argument.
    deadline = time.monotonic() + 30  # a loaded CI machine; returns as soon as it holds
    while (processes_naming(token) or any(map(_alive, children))) and (time.monotonic() < deadline):
        await asyncio.sleep(0.05)
    assert processes_naming(token) == set()
    assert not any(map(_alive, children))
    assert not _alive(helper.pid)


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


async def test_the_compiled_child_starts_on_the_helpers_memory(tmp_path: Path) -> None:
    """No fork: a fork marks every page of the helper copy-on-write, and the helper then
    faulted on each page it wrote (about 550 a command). Started as posix_spawn starts a
    child, the helper's memory is never copied."""
    if compiled_child._checked() is None:
        if os.environ.get("CI"):
            pytest.fail("CI has a C compiler: the package's build must have built the child")
        pytest.skip("no compiled child built here: the helper forks in Python")
    out_r, out_w = os.pipe()
    helper = SpawnHelper()
    try:
        assert helper.compiled_child

        async def one(i: int) -> int:
            setup = ChildSetup()
            (tmp_path / f"made-{i}").touch()
            setup.write_file(str(tmp_path / f"made-{i}"), b"x")  # a step, in the child
            plan = SpawnPlan(argv=("/bin/sh", "-c", f"exit {i}"), env={}, cwd=str(tmp_path))
            child = await helper.launch_async(
                dataclasses.replace(plan, preexec_fn=setup), stdin=-1, stdout=out_w, stderr=out_w
            )
            ended = asyncio.get_running_loop().create_future()
            child.on_exit(lambda: ended.set_result(None))
            await asyncio.wait_for(ended, 30)
            return child.wait()

        for i in range(3):  # the helper's own first-use allocations
            await one(i)
        before = _minor_faults(helper.pid)
        statuses = [await one(i) for i in range(30)]
        faults = (_minor_faults(helper.pid) - before) / 30
    finally:
        helper.close()
        os.close(out_r)
        os.close(out_w)
    assert statuses == list(range(30))
    assert faults < 100, f"{faults:.0f} page faults in the helper per spawn: was it forked?"


async def test_children_started_at_once_each_run_their_own_command(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    """Many spawns in flight (several spawner threads, each child on the helper's memory
    until it execs): each command gets its own argv, environment, descriptors and status."""
    ex = make_executor(mode="workspace-write", spawn_helper=True)

    async def one(i: int) -> tuple[int, str]:
        request = BashExecRequest(
            command=f'echo "$TOKEN:{i}" > out-{i}; cat out-{i}; exit {i}',
            workdir=str(workspace),
            env={"TOKEN": f"t{i}"},
        )
        result = await ex.run(ex.resolve(request))
        return result.exit_code, result.stdout.text

    results = await asyncio.gather(*(one(i) for i in range(40)))
    assert results == [(i, f"t{i}:{i}\n") for i in range(40)]


@pytest.mark.parametrize("init", [True, False], ids=["init-waiter", "waiter-in-place"])
async def test_a_running_command_holds_no_spawn_back(
    init: bool,
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The helper is suspended only while a child sets up: with the init to exec, the
    waiter leaves the helper's memory at once; without it, the child is forked."""
    if init and sandbox_init.built() is None:
        pytest.skip("no compiled init built here")
    monkeypatch.setattr(sandbox_init, "ENABLED", init)
    ex = make_executor(mode="workspace-write", spawn_helper=True)
    token = sleep_token()
    process = await ex.start(ex.resolve(BashExecRequest(command=f"sleep {token}")))
    try:
        quick = await ex.run(ex.resolve(BashExecRequest(command="echo quick")))
        assert quick.stdout.text == "quick\n"
        assert processes_naming(f"sleep\0{token}"), "the first command is still running"
    finally:
        process.kill()
        await process.wait()
    assert processes_naming(f"sleep\0{token}") == set()
