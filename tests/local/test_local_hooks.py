"""The one hook a confining executor relies on: a `SpawnScope` owning the plan, the spawn,
the facts and one close."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest
from local_probes import GRACE_MS, pids_in, wait_dead, wait_for

from bash_local import (
    ExecutorClosedError,
    LocalBashExecutor,
    SpawnOutcome,
    SpawnPlan,
    SpawnScope,
    UnconfinedSpawn,
)
from bash_seam import (
    BashExecError,
    BashExecRequest,
    BashExecSpec,
    BashProcess,
    SandboxFacts,
    ShellNotFoundError,
)
from policies import SandboxMode

FACTS = SandboxFacts(mode=SandboxMode.READ_ONLY, denied=False, enforcement=None)


@dataclass(frozen=True)
class TaggedPlan(SpawnPlan):
    """A subclass's typed plan: the executor hands this very plan back to every hook."""

    tag: str = "confined"


class RecordingScope(SpawnScope):
    """Wraps the plan like a confining backend would, and records each call."""

    def __init__(self, ex: RecordingExecutor, plan: SpawnPlan) -> None:
        self.ex = ex
        wrapped = replace(plan, argv=(*ex.wrapper, *plan.argv))
        self.plan = TaggedPlan(**{f.name: getattr(wrapped, f.name) for f in fields(SpawnPlan)})

    def spawned(self, pid: int, kill: Callable[[], None]) -> None:
        self.ex.spawned_pids.append(pid)

    async def settled(self, outcome: SpawnOutcome) -> SandboxFacts | None:
        self.ex.facts_calls.append(
            {
                "tag": getattr(self.plan, "tag", None),
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "stderr_text": outcome.stderr,
                "background": outcome.background,
                "started": outcome.started,
                "closes_before": self.ex.closes,
            }
        )
        if self.ex.facts_error is not None:
            raise self.ex.facts_error
        return FACTS

    def failed(self, exc: BaseException) -> Exception:
        self.ex.spawn_errors.append((type(exc).__name__, self.ex.closes))
        return super().failed(exc)

    def close(self) -> None:
        self.ex.closes += 1


class RecordingExecutor(LocalBashExecutor):
    """Opens a `RecordingScope` for every spawn and records each call."""

    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        super().__init__(cwd=str(tmp_path), grace_ms=GRACE_MS, **overrides)
        self.base_plans: list[SpawnPlan] = []
        self.closes = 0
        self.facts_calls: list[dict[str, object]] = []
        self.group_signals: list[tuple[int, int]] = []
        self.spawn_errors: list[tuple[str, int]] = []
        self.spawned_pids: list[int] = []
        self.confine_error: Exception | None = None
        self.facts_error: Exception | None = None
        self.wrapper: tuple[str, ...] = ("/usr/bin/env", "CONFINED=yes")

    async def _open_scope(self, spec: BashExecSpec) -> SpawnScope:
        plan = self._base_plan(spec)
        self.base_plans.append(plan)
        if self.confine_error is not None:
            raise self.confine_error
        return RecordingScope(self, plan)

    def _kill_group(self, pid: int, sig: int) -> None:
        self.group_signals.append((pid, sig))
        super()._kill_group(pid, sig)

    def spec(self, command: str, **fields: Any) -> BashExecSpec:
        return self.resolve(BashExecRequest(command=command, **fields))


@pytest.fixture
async def recording(tmp_path: Path) -> AsyncIterator[RecordingExecutor]:
    ex = RecordingExecutor(tmp_path)
    yield ex
    await ex.aclose()


async def test_base_plan_is_bash_c_with_built_env_and_workdir(
    recording: RecordingExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOME_TOKEN", "hidden")
    result = await recording.run(recording.spec("echo $CONFINED", env={"X": "1"}))
    (plan,) = recording.base_plans
    assert os.path.isabs(plan.argv[0]) and os.path.basename(plan.argv[0]) == "bash"
    assert plan.argv[1:] == ("-c", "echo $CONFINED")
    assert plan.cwd == str(tmp_path)
    assert plan.env["X"] == "1" and "SOME_TOKEN" not in plan.env
    assert plan.preexec_fn is None and plan.pass_fds == () and plan.release is None
    # The confined plan is what ran, and the scope saw its pid.
    assert result.stdout.text == "yes\n"
    assert len(recording.spawned_pids) == 1


async def test_outcome_facts_see_the_settled_run_and_land_in_the_result(
    recording: RecordingExecutor,
) -> None:
    result = await recording.run(recording.spec("echo nope >&2; exit 3"))
    assert result.sandbox == FACTS
    (call,) = recording.facts_calls
    assert call == {
        "tag": "confined",
        "exit_code": 3,
        "signal": None,
        "stderr_text": "nope\n",
        "background": False,
        "started": True,
        "closes_before": 0,  # the scope still holds everything while the facts are read
    }
    assert recording.closes == 1


async def test_the_settled_group_gets_sigkill_before_the_leader_is_reaped(
    recording: RecordingExecutor,
) -> None:
    result = await recording.run(recording.spec("echo $$"))
    (pid,) = pids_in(result.stdout.text)
    assert recording.group_signals == [(pid, signal.SIGKILL)]


async def test_confine_error_propagates_before_anything_spawns(
    recording: RecordingExecutor, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    recording.confine_error = RuntimeError("no backend here")
    with pytest.raises(RuntimeError, match="no backend here"):
        await recording.run(recording.spec(f"touch {marker}"))
    with pytest.raises(RuntimeError, match="no backend here"):
        await recording.start(recording.spec(f"touch {marker}"))
    recording.confine_error = None
    await recording.run(recording.spec("true"))
    assert not marker.exists()
    assert recording.list() == []
    assert recording.closes == 1


async def test_foreground_facts_error_propagates_after_cleanup(
    recording: RecordingExecutor, spawned_pids: list[int]
) -> None:
    recording.facts_error = RuntimeError("runner failed")
    with pytest.raises(RuntimeError, match="runner failed"):
        await recording.run(recording.spec("sleep 100 >/dev/null & echo $! >&2"))
    (leftover,) = pids_in(str(recording.facts_calls[0]["stderr_text"]))
    spawned_pids.append(leftover)
    wait_dead(leftover)
    assert recording.closes == 1


async def test_background_facts_are_stamped_before_wait_returns(
    recording: RecordingExecutor,
) -> None:
    process = await recording.start(recording.spec("echo e >&2; exit 5"))
    await process.wait()
    assert process.sandbox == FACTS
    (call,) = recording.facts_calls
    assert call["background"] is True and call["exit_code"] == 5 and call["stderr_text"] == "e\n"
    assert recording.closes == 1


async def test_background_facts_error_is_logged_and_contained(
    recording: RecordingExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    recording.facts_error = RuntimeError("classifier bug")
    with caplog.at_level(logging.ERROR, logger="bash_local"):
        process = await recording.start(recording.spec("true"))
        await process.wait()
    assert process.status == "completed" and process.sandbox is None
    assert any("classifier bug" in (r.exc_text or "") for r in caplog.records)


async def test_background_spawn_failure_settles_killed_with_the_error_on_stderr(
    recording: RecordingExecutor,
) -> None:
    recording.wrapper = ("/nonexistent/runner",)
    done: list[BashProcess] = []
    recording.on_task_done(done.append)
    process = await recording.start(recording.spec("true"))
    await process.wait()
    assert process.status == "killed"
    assert process.exit_code is None and process.signal is None
    read = process.read_output()
    assert read.delta.startswith("[stderr]\n")
    assert "/nonexistent/runner" in read.delta
    assert recording.closes == 1
    assert recording.spawn_errors == [("FileNotFoundError", 0)]  # mapped for stderr too
    assert process.sandbox == FACTS
    (call,) = recording.facts_calls  # the never-started spawn still gets its facts
    assert call["started"] is False and call["background"] is True
    await wait_for(lambda: done == [process])


async def test_foreground_spawn_failure_raises_and_releases(
    recording: RecordingExecutor,
) -> None:
    recording.wrapper = ("/nonexistent/runner",)
    with pytest.raises(ShellNotFoundError, match="/nonexistent/runner"):
        await recording.run(recording.spec("true"))
    recording.wrapper = ("/dev/null",)  # exists but cannot be executed
    with pytest.raises(BashExecError, match="/dev/null"):
        await recording.run(recording.spec("true"))
    assert recording.closes == 2
    # The error was mapped while the plan (and its fds) still stood.
    assert recording.spawn_errors == [("FileNotFoundError", 0), ("PermissionError", 1)]


async def test_pass_fds_and_preexec_fn_of_a_plan_reach_the_child(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()

    def set_umask() -> None:
        os.umask(0o077)

    class PassingExecutor(LocalBashExecutor):
        async def _open_scope(self, spec: BashExecSpec) -> SpawnScope:
            plan = self._base_plan(spec)
            return UnconfinedSpawn(
                replace(
                    plan,
                    argv=(*plan.argv[:2], f"echo through >&{write_end}; umask"),
                    preexec_fn=set_umask,
                    pass_fds=(write_end,),
                    release=lambda: os.close(write_end),
                )
            )

    async with PassingExecutor(cwd=str(tmp_path)) as ex:
        result = await ex.run(ex.resolve(BashExecRequest(command="ignored")))
    assert result.stdout.text == "0077\n"  # the pre-exec step ran in the child
    assert os.read(read_end, 100) == b"through\n"
    with pytest.raises(OSError):
        os.fstat(write_end)  # released exactly once, by the executor
    os.close(read_end)


async def test_cancelled_run_still_releases_once_settled(
    recording: RecordingExecutor, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    task = asyncio.create_task(recording.run(recording.spec(f"touch {ready}; sleep 100")))
    await wait_for(ready.exists)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: recording.closes == 1)
    # Nobody awaits the outcome, but the scope still settled (a git import must not wait
    # for a reader) before it closed.
    (call,) = recording.facts_calls
    assert call["closes_before"] == 0


async def test_a_settle_that_fails_on_what_the_close_took_is_reported_as_the_close(
    tmp_path: Path,
) -> None:
    """A command spawned while `aclose()` runs settles on what the close already took (a
    confining executor's settle threads: "cannot schedule new futures after shutdown"):
    its run reports the close, with that error as the cause, not the error itself."""
    ready = tmp_path / "ready"

    class ClosingScope(UnconfinedSpawn):
        def __init__(self, plan: SpawnPlan, executor: LocalBashExecutor) -> None:
            super().__init__(plan)
            self._executor = executor

        async def settled(self, outcome: SpawnOutcome) -> SandboxFacts | None:
            if self._executor._closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            return None

    class ClosingExecutor(LocalBashExecutor):
        async def _open_scope(self, spec: BashExecSpec) -> SpawnScope:
            return ClosingScope(self._base_plan(spec), self)

    ex = ClosingExecutor(cwd=str(tmp_path))
    task = asyncio.create_task(
        ex.run(ex.resolve(BashExecRequest(command=f"touch {ready}; sleep 100")))
    )
    await wait_for(ready.exists)
    await ex.aclose()
    with pytest.raises(ExecutorClosedError) as caught:
        await task
    assert isinstance(caught.value.__cause__, RuntimeError)
