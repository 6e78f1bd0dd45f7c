"""Foreground `run()`: exit status, limits, signals, process-group lifetime, stdin, failures.

Every "killed" claim is checked from outside: the pid is gone, not just the result says so.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from local_probes import GRACE_MS, is_alive, pids_in, wait_dead, wait_for

from bash_local import ExecutorClosedError, LocalBashExecutor
from bash_seam import (
    AbortController,
    AbortedBeforeStartError,
    BashExecRequest,
    BashExecSpec,
    EnvChannelError,
    ShellNotFoundError,
    WorkdirError,
)

Spec = Callable[..., BashExecSpec]


async def test_exit_code_and_both_streams_are_reported(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(spec("echo out; echo err >&2; exit 3"))
    assert result.exit_code == 3 and result.signal is None
    assert result.stdout.text == "out\n" and result.stderr.text == "err\n"
    assert not result.timed_out and not result.aborted
    assert result.sandbox is None
    assert result.timeout_ms == 20_000


async def test_command_runs_in_workdir_in_its_own_session_without_tty(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    result = await executor.run(spec("echo $$; pwd; cat /proc/$$/stat", workdir=str(work)))
    pid_line, pwd, stat = result.stdout.text.splitlines()
    fields = stat.rsplit(")", 1)[1].split()
    pgrp, session, tty = int(fields[2]), int(fields[3]), int(fields[4])
    assert pwd == str(work)
    assert pgrp == session == int(pid_line)
    assert tty == 0


async def test_fd0_is_dev_null_without_stdin(executor: LocalBashExecutor, spec: Spec) -> None:
    result = await executor.run(spec("readlink /proc/self/fd/0; cat"))
    assert result.stdout.text == "/dev/null\n"
    assert result.exit_code == 0


async def test_stdin_text_and_bytes_reach_the_command(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(spec("cat", stdin="héllo\n"))
    assert result.stdout.text == "héllo\n"
    result = await executor.run(spec("od -An -tx1", stdin=b"\x00\xff"))
    assert result.stdout.text.split() == ["00", "ff"]
    result = await executor.run(spec("wc -c", stdin=b""))
    assert result.stdout.text.strip() == "0"


async def test_large_stdin_into_a_command_that_exits_early_is_no_error(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(spec("exit 7", stdin=b"x" * (1 << 20)))
    assert result.exit_code == 7
    assert not result.timed_out


async def test_large_stdin_is_delivered_whole(executor: LocalBashExecutor, spec: Spec) -> None:
    result = await executor.run(spec("wc -c", stdin=b"y" * (3 << 20)))
    assert result.stdout.text.strip() == str(3 << 20)


async def test_timeout_kills_the_group_and_reports_timed_out(
    executor: LocalBashExecutor, spec: Spec, spawned_pids: list[int]
) -> None:
    started = time.monotonic()
    result = await executor.run(spec("sleep 100 & echo $!; sleep 100", timeout_ms=150))
    elapsed = time.monotonic() - started
    assert result.timed_out and not result.aborted
    assert result.exit_code is None and result.signal == "SIGTERM"
    assert result.timeout_ms == 150
    assert elapsed < 2.0
    (grandchild,) = pids_in(result.stdout.text)
    spawned_pids.append(grandchild)
    wait_dead(grandchild)


async def test_term_trapping_command_is_escalated_to_sigkill(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    started = time.monotonic()
    # An ignored TERM is inherited by `sleep`, so only SIGKILL ends the group.
    result = await executor.run(spec("trap '' TERM; echo $$; sleep 100", timeout_ms=100))
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert result.signal == "SIGKILL" and result.exit_code is None
    assert elapsed < 0.1 + GRACE_MS / 1000 + 1.5
    wait_dead(pids_in(result.stdout.text)[0])


async def test_self_kill_is_neither_timed_out_nor_aborted(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(spec("kill -TERM $$"))
    assert result.signal == "SIGTERM" and result.exit_code is None
    assert not result.timed_out and not result.aborted


async def test_leftover_background_job_does_not_survive_a_finished_run(
    executor: LocalBashExecutor, spec: Spec, spawned_pids: list[int]
) -> None:
    result = await executor.run(spec("sleep 100 >/dev/null 2>&1 & echo $!"))
    assert result.exit_code == 0
    (leftover,) = pids_in(result.stdout.text)
    spawned_pids.append(leftover)
    wait_dead(leftover)


async def test_descendant_holding_the_pipes_delays_settling_at_most_grace(
    executor: LocalBashExecutor, spec: Spec, spawned_pids: list[int]
) -> None:
    started = time.monotonic()
    result = await executor.run(spec("sleep 30 & echo $!; echo done"))
    elapsed = time.monotonic() - started
    assert result.exit_code == 0
    assert result.stdout.text.endswith("done\n")
    assert GRACE_MS / 1000 * 0.9 <= elapsed < GRACE_MS / 1000 + 1.5
    (holder,) = pids_in(result.stdout.text)
    spawned_pids.append(holder)
    wait_dead(holder)


async def test_output_written_before_the_shell_exits_is_kept(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(spec("(sleep 0.05; echo late) & echo early"))
    assert result.stdout.text == "early\nlate\n"


async def test_abort_during_run_from_another_thread(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path, spawned_pids: list[int]
) -> None:
    controller = AbortController()
    ready = tmp_path / "ready"
    task = asyncio.create_task(
        executor.run(spec(f"sleep 100 & echo $! > {ready}; wait", signal=controller.signal))
    )
    await wait_for(lambda: ready.exists() and ready.read_text().strip() != "")
    spawned_pids.extend(pids_in(ready.read_text()))
    threading.Thread(target=controller.abort, args=("user pressed stop",)).start()
    result = await task
    assert result.aborted and not result.timed_out
    assert result.signal == "SIGTERM"
    wait_dead(spawned_pids[0])


async def test_timeout_first_then_abort_reports_only_timed_out(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    controller = AbortController()
    termed = tmp_path / "termed"
    command = f"trap 'touch {termed}' TERM; while :; do sleep 0.02; done"
    task = asyncio.create_task(
        executor.run(spec(command, timeout_ms=100, signal=controller.signal))
    )
    await wait_for(termed.exists)  # the timeout's SIGTERM arrived; SIGKILL follows after grace
    controller.abort()
    result = await task
    assert result.timed_out and not result.aborted
    assert result.signal == "SIGKILL"


async def test_abort_first_then_timeout_reports_only_aborted(tmp_path: Path) -> None:
    controller = AbortController()
    ready, termed = tmp_path / "ready", tmp_path / "termed"
    command = f"trap 'touch {termed}' TERM; touch {ready}; while :; do sleep 0.02; done"
    timeout_s = 0.4
    # A long grace keeps the group alive (TERM is trapped) while the timeout comes due.
    async with LocalBashExecutor(cwd=str(tmp_path), grace_ms=1_000) as ex:
        started = time.monotonic()
        task = asyncio.create_task(
            ex.run(
                ex.resolve(
                    BashExecRequest(
                        command=command, timeout_ms=int(timeout_s * 1000), signal=controller.signal
                    )
                )
            )
        )
        await wait_for(ready.exists)
        if time.monotonic() - started > timeout_s / 2:
            task.cancel()
            pytest.skip("the command took too long to start on this machine")
        controller.abort()
        await wait_for(termed.exists)
        result = await task
    assert time.monotonic() - started > timeout_s  # the timeout came due during the grace
    assert result.aborted and not result.timed_out
    assert result.signal == "SIGKILL"


async def test_pre_aborted_signal_raises_and_spawns_nothing(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    controller = AbortController()
    controller.abort()
    marker = tmp_path / "marker"
    with pytest.raises(AbortedBeforeStartError):
        await executor.run(spec(f"touch {marker}", signal=controller.signal))
    with pytest.raises(AbortedBeforeStartError):
        await executor.start(spec(f"touch {marker}", signal=controller.signal))
    result = await executor.run(spec("sleep 0.05"))  # anything spawned would have run by now
    assert result.exit_code == 0
    assert not marker.exists()
    assert executor.list() == []


async def test_cancelling_the_awaiting_task_kills_the_group(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path, spawned_pids: list[int]
) -> None:
    pids = tmp_path / "pids"
    task = asyncio.create_task(
        executor.run(spec(f"sleep 100 & echo $$ $! > {pids}; wait", timeout_ms=60_000))
    )
    await wait_for(lambda: pids.exists() and len(pids_in(pids.read_text())) == 2)
    shell, grandchild = pids_in(pids.read_text())
    spawned_pids.extend([shell, grandchild])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    wait_dead(grandchild, timeout=1.0)  # SIGKILL, not a grace period
    wait_dead(shell, timeout=1.0)


async def test_concurrent_runs_do_not_mix_output(executor: LocalBashExecutor, spec: Spec) -> None:
    results = await asyncio.gather(
        *(executor.run(spec(f"echo {i}; echo e{i} >&2; exit {i % 5}")) for i in range(30))
    )
    for i, result in enumerate(results):
        assert result.stdout.text == f"{i}\n" and result.stderr.text == f"e{i}\n"
        assert result.exit_code == i % 5


async def test_workdir_removed_after_resolve_raises_workdir_error(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path
) -> None:
    work = tmp_path / "gone"
    work.mkdir()
    resolved = spec("true", workdir=str(work))
    work.rmdir()
    with pytest.raises(WorkdirError, match="gone"):
        await executor.run(resolved)


async def test_hand_built_spec_with_relative_workdir_raises(executor: LocalBashExecutor) -> None:
    bad = BashExecSpec(
        command="true",
        workdir="rel",
        timeout_ms=100,
        stdout_max_bytes=10,
        owner=None,
        sandbox_policy=None,
    )
    with pytest.raises(WorkdirError, match="rel"):
        await executor.run(bad)


async def test_env_channel_misuse_in_a_hand_built_spec_raises_before_spawning(
    executor: LocalBashExecutor, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    bad = BashExecSpec(
        command=f"touch {marker}",
        workdir=str(tmp_path),
        timeout_ms=1000,
        stdout_max_bytes=10,
        owner=None,
        sandbox_policy=None,
        env={"DSH_X": "1"},
    )
    with pytest.raises(EnvChannelError):
        await executor.run(bad)
    assert not marker.exists()


async def test_missing_bash_raises_shell_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    async with LocalBashExecutor() as ex:
        with pytest.raises(ShellNotFoundError):
            await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(tmp_path))))


async def test_bash_is_resolved_once_to_an_absolute_path(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await executor.run(spec("echo $BASH"))
    monkeypatch.setenv("PATH", str(tmp_path))  # later PATH changes do not matter
    second = await executor.run(spec("echo $BASH"))
    assert first.stdout.text == second.stdout.text
    assert os.path.isabs(first.stdout.text.strip())


async def test_aclose_ends_a_foreground_run_and_closes_the_executor(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path, spawned_pids: list[int]
) -> None:
    ready = tmp_path / "ready"
    task = asyncio.create_task(executor.run(spec(f"echo $$ > {ready}; sleep 100")))
    await wait_for(lambda: ready.exists() and ready.read_text().strip() != "")
    spawned_pids.extend(pids_in(ready.read_text()))
    await executor.aclose()
    result = await task
    assert result.signal == "SIGTERM"
    assert not result.timed_out and not result.aborted
    assert not is_alive(spawned_pids[0])
    with pytest.raises(ExecutorClosedError):
        await executor.run(spec("true"))


async def test_without_pidfd_a_waiter_thread_watches_the_leader(
    spec: Spec,
    executor: LocalBashExecutor,
    monkeypatch: pytest.MonkeyPatch,
    spawned_pids: list[int],
) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError("pidfd_open unavailable")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd, raising=False)
    result = await executor.run(spec("sleep 100 >/dev/null & echo $!; exit 6"))
    assert result.exit_code == 6
    (leftover,) = pids_in(result.stdout.text)
    spawned_pids.append(leftover)
    wait_dead(leftover)
    result = await executor.run(spec("sleep 100", timeout_ms=100))
    assert result.timed_out and result.signal == "SIGTERM"


async def test_no_descriptor_outlives_its_run(executor: LocalBashExecutor, spec: Spec) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    await executor.run(spec("true"))  # warm-up: lazy imports and the bash lookup
    before = open_fds()
    for _ in range(10):
        await executor.run(spec("echo x; echo y >&2", stdin=b"z" * 100_000))
        await executor.run(spec("sleep 100", timeout_ms=20))
        await executor.run(spec("seq 100000", stdout_max_bytes=10))
        process = await executor.start(spec("cat", stdin="in"))
        await process.wait()
    assert open_fds() == before
