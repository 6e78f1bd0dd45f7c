"""The executor's own work on the harness's event loop comes in turns (`loop_turns.py`): a task
a due timer or ready I/O wakes runs before a spawn's next stage, and concurrent spawns
prepare one stage per turn, one spawn at a time. Ordering only, never timing."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox.confined_spawn import ConfinedSpawn
from bash_sandbox.loop_turns import LoopLock, give_way
from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory


@pytest.mark.parametrize("wake", ["timer", "io"])
async def test_a_task_a_due_timer_or_ready_io_wakes_runs_before_give_way_returns(
    wake: str,
) -> None:
    loop = asyncio.get_running_loop()
    order: list[str] = []
    woken: asyncio.Future[None] = loop.create_future()

    async def sleeper() -> None:
        await woken
        order.append("woken")

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)  # the sleeper waits on its future now
    ours, theirs = socket.socketpair()
    try:
        if wake == "timer":
            loop.call_later(0, woken.set_result, None)
        else:

            def readable() -> None:
                loop.remove_reader(ours.fileno())
                woken.set_result(None)

            loop.add_reader(ours.fileno(), readable)
            theirs.send(b"x")
        await give_way()
        order.append("after")
        await task
    finally:
        ours.close()
        theirs.close()
    # With a bare `asyncio.sleep(0)` (or two) the order is the other way round.
    assert order == ["woken", "after"]


def test_the_lock_follows_the_loop_that_uses_the_executor() -> None:
    turns = LoopLock()

    async def hold() -> asyncio.Lock:
        lock = turns.lock()
        async with lock:
            await asyncio.sleep(0)
        return lock

    first = asyncio.run(hold())
    second = asyncio.run(hold())  # a harness's next `asyncio.run`: a lock of its own
    assert first is not second


async def test_concurrent_spawns_prepare_one_stage_per_turn(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []

    def logged(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def stage(self: ConfinedSpawn, *args: Any, **kwargs: Any) -> Any:
            log.append(f"{id(self)}:{name}")
            return real(self, *args, **kwargs)

        return stage

    for name in ("_survey", "_environment", "_wrap"):
        monkeypatch.setattr(ConfinedSpawn, name, logged(name, getattr(ConfinedSpawn, name)))
    ex = make_executor()
    spec = ex.resolve(BashExecRequest(command="true", workdir=str(workspace)))
    assert (await ex.run(spec)).exit_code == 0  # namespaces and helper made
    log.clear()
    done = False

    async def harness_task() -> None:  # always ready: runs whenever the loop takes a turn
        while not done:
            log.append("tick")
            await asyncio.sleep(0)

    ticker = asyncio.create_task(harness_task())
    results = await asyncio.gather(*(ex.run(spec) for _ in range(4)))
    done = True
    await ticker
    assert [r.exit_code for r in results] == [0, 0, 0, 0]
    stages = [i for i, entry in enumerate(log) if entry != "tick"]
    names = [log[i].split(":")[1] for i in stages]
    assert names == ["_environment", "_survey", "_wrap"] * 4, names
    for a, b in itertools.pairwise(stages):
        assert "tick" in log[a + 1 : b], log[a : b + 1]  # the loop took a turn in between
    # One spawn at a time: each spawn's three stages come together.
    owners = [log[i].split(":")[0] for i in stages]
    assert all(owners[i] == owners[i + 1] == owners[i + 2] for i in range(0, 12, 3))
    assert len(set(owners)) == 4
