"""Background processes: ids, owners, incremental reads, kill, listeners, and `aclose()`."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from local_probes import is_alive, pids_in, wait_dead, wait_for

from bash_local import ExecutorClosedError, LocalBashExecutor
from bash_seam import (
    AbortController,
    AbortedBeforeStartError,
    BashExecRequest,
    BashExecSpec,
    BashProcess,
)

Spec = Callable[..., BashExecSpec]


def status_of(process: BashProcess) -> str:
    """Read through a function so the type checker does not pin the property to one value."""
    return process.status


def holds_two_pids(path: Path) -> bool:
    return path.exists() and len(pids_in(path.read_text())) == 2


async def test_ids_count_per_executor_and_owner_is_returned_verbatim(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    first = await executor.start(spec("true", owner="tool-call-1"))
    second = await executor.start(spec("true"))
    assert (first.id, second.id) == ("bash-1", "bash-2")
    assert first.owner == executor.owner_of("bash-1") == "tool-call-1"
    assert executor.owner_of("bash-2") is None
    assert executor.get("bash-1") is first
    assert executor.list() == [first, second]
    assert first.command == "true"
    async with LocalBashExecutor(cwd=str(tmp_path)) as other:
        other_first = await other.start(other.resolve(BashExecRequest(command="true")))
        assert other_first.id == "bash-1"


async def test_unknown_ids(executor: LocalBashExecutor) -> None:
    with pytest.raises(KeyError):
        executor.get("bash-99")
    for call in (executor.owner_of, executor.read_output, executor.kill):
        with pytest.raises(KeyError):
            call("bash-99")


async def test_start_returns_while_running_and_wait_settles(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    process = await executor.start(spec(f"until [ -e {gate} ]; do sleep 0.01; done; exit 4"))
    assert status_of(process) == "running"
    assert process.exit_code is None
    gate.touch()
    await process.wait()
    assert process.status == "completed"
    assert process.exit_code == 4 and process.signal is None
    assert process.sandbox is None


async def test_read_output_is_incremental_and_consuming(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    process = await executor.start(
        spec(f"echo one; until [ -e {gate} ]; do sleep 0.01; done; echo two; echo oops >&2")
    )
    seen: list[str] = []

    def got_first_line() -> bool:
        seen.append(executor.read_output(process.id).delta)
        return "".join(seen) != ""

    await wait_for(got_first_line)
    assert "".join(seen) == "one\n"
    assert executor.read_output(process.id).delta == ""
    gate.touch()
    await process.wait()
    read = process.read_output()
    assert read.delta == "two\n[stderr]\noops\n"
    assert not read.lossy
    assert process.read_output().delta == ""


async def test_stderr_marker_starts_its_own_line(executor: LocalBashExecutor, spec: Spec) -> None:
    process = await executor.start(spec("printf partial; printf problem >&2"))
    await process.wait()
    assert process.read_output().delta == "partial\n[stderr]\nproblem"


async def test_a_backlog_larger_than_the_cap_reads_as_its_tail_with_the_spill_named(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    process = await executor.start(spec("seq 2000", stdout_max_bytes=100))
    await process.wait()
    read = process.read_output()
    everything = "".join(f"{i}\n" for i in range(1, 2001))
    assert len(read.delta.encode()) <= 100
    assert everything.endswith(read.delta)
    assert read.lossy
    assert read.stdout_spill_path is not None and read.stderr_spill_path is None
    with open(read.stdout_spill_path) as fh:
        assert fh.read() == everything
    assert process.read_output().delta == ""


async def test_a_read_of_dropped_bytes_is_lossy(tmp_path: Path) -> None:
    async with LocalBashExecutor(
        cwd=str(tmp_path), spill_dir=str(tmp_path), max_spill_bytes=200
    ) as ex:
        process = await ex.start(
            ex.resolve(BashExecRequest(command="seq 100000", stdout_max_bytes=100))
        )
        await process.wait()
        read = process.read_output()
    assert read.lossy
    assert read.stdout_spill_path is None
    assert read.delta.endswith("99999\n100000\n")
    # Only the memory window is left: the cap plus at most one read chunk.
    assert len(read.delta.encode()) < 100 + 65536
    assert process.read_output().delta == ""


async def test_kill_is_idempotent_and_false_once_finished(
    executor: LocalBashExecutor, spec: Spec, spawned_pids: list[int], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    process = await executor.start(spec(f"sleep 100 & echo $$ $! > {pids}; wait"))
    await wait_for(functools.partial(holds_two_pids, pids))
    spawned_pids.extend(pids_in(pids.read_text()))
    assert executor.kill(process.id) is True
    assert process.kill() is True  # still settling: nothing new happens
    await process.wait()
    assert process.status == "killed"
    assert process.signal == "SIGTERM" and process.exit_code is None
    assert process.kill() is False
    assert executor.kill(process.id) is False
    for pid in spawned_pids:
        wait_dead(pid)


async def test_a_command_that_kills_itself_is_completed_not_killed(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    process = await executor.start(spec("kill -KILL $$"))
    await process.wait()
    assert process.status == "completed"
    assert process.signal == "SIGKILL"


async def test_leftovers_of_a_completed_background_command_are_killed(
    executor: LocalBashExecutor, spec: Spec, spawned_pids: list[int]
) -> None:
    process = await executor.start(spec("sleep 100 >/dev/null 2>&1 & echo $!"))
    await process.wait()
    assert process.status == "completed"
    (leftover,) = pids_in(process.read_output().delta)
    spawned_pids.append(leftover)
    wait_dead(leftover)


async def test_abort_signal_kills_a_background_command(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    controller = AbortController()
    process = await executor.start(spec("sleep 100", signal=controller.signal))
    controller.abort()
    await process.wait()
    assert process.status == "killed"


async def test_listeners_fire_once_per_process_and_failures_are_contained(
    executor: LocalBashExecutor, spec: Spec, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[str, str]] = []

    def broken(process: BashProcess) -> None:
        raise RuntimeError("listener bug")

    executor.on_task_done(broken)
    executor.on_task_done(lambda p: calls.append((p.id, p.status)))
    disposed: list[str] = []
    executor.on_task_done(lambda p: disposed.append(p.id))()  # disposed at once
    with caplog.at_level(logging.ERROR, logger="bash_local"):
        first = await executor.start(spec("exit 1"))
        second = await executor.start(spec("true"))
        await first.wait()
        await second.wait()
        await wait_for(lambda: len(calls) == 2)
    assert sorted(calls) == [("bash-1", "completed"), ("bash-2", "completed")]
    assert disposed == []
    assert sum("listener bug" in r.exc_text for r in caplog.records if r.exc_text) == 2
    assert all(r.name == "bash_local" for r in caplog.records)


async def test_listeners_never_fire_after_aclose(executor: LocalBashExecutor, spec: Spec) -> None:
    calls: list[str] = []
    executor.on_task_done(lambda p: calls.append(p.id))
    process = await executor.start(spec("sleep 100"))
    await executor.aclose()
    assert process.status == "killed"
    assert calls == []


async def test_aclose_kills_every_group_and_waits(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path, spawned_pids: list[int]
) -> None:
    files = [tmp_path / f"pids{i}" for i in range(3)]
    processes = [
        await executor.start(spec(f"sleep 100 & echo $$ $! > {f}; trap '' TERM; wait"))
        for f in files
    ]
    done = await executor.start(spec("exit 2"))
    await done.wait()
    for f in files:
        await wait_for(functools.partial(holds_two_pids, f))
        spawned_pids.extend(pids_in(f.read_text()))
    await executor.aclose()
    assert [p.status for p in processes] == ["killed"] * 3
    assert done.status == "completed" and done.exit_code == 2
    assert not any(is_alive(pid) for pid in spawned_pids)
    await executor.aclose()  # idempotent
    with pytest.raises(ExecutorClosedError):
        await executor.start(spec("true"))


async def test_wait_of_a_cancelled_waiter_does_not_disturb_the_process(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    process = await executor.start(spec(f"until [ -e {gate} ]; do sleep 0.01; done"))
    waiter = asyncio.create_task(process.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert status_of(process) == "running"
    gate.touch()
    await process.wait()
    assert process.status == "completed"


async def test_pid_of_a_background_command_is_its_process_group(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    process = await executor.start(spec("echo $$; cat /proc/$$/stat"))
    await process.wait()
    pid_line, stat = process.read_output().delta.splitlines()
    assert int(stat.rsplit(")", 1)[1].split()[2]) == int(pid_line)
    assert int(pid_line) != os.getpgrp()


async def test_rejected_specs_take_no_id(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    controller = AbortController()
    controller.abort()
    with pytest.raises(AbortedBeforeStartError):
        await executor.start(spec("true", signal=controller.signal))
    process = await executor.start(spec("true"))
    assert process.id == "bash-1"
