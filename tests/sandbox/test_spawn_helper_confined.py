"""A chosen part of the confinement tests, run again with the spawn helper on.

The tests are the very functions of `test_executor_confined.py`; this module's
`make_executor` turns the helper on for every executor they make, and checks that each made
executor really spawned through it. The whole suites run on the helper path with
``BASH_SANDBOX_TEST_SPAWN_HELPER=1`` (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest, BashRunResult
from tests.sandbox.conftest import ExecutorFactory
from tests.sandbox.test_executor_confined import (  # noqa: F401 - collected here again
    test_a_covered_directory_that_vanishes_before_the_mount_is_looked_at_again,
    test_a_secret_beside_the_workspace_under_tmp_stays_unreadable,
    test_a_spawn_that_fails_midway_gives_back_everything_it_took,
    test_background_denial_is_stamped_before_wait_returns,
    test_every_mount_of_the_view_is_nosuid_and_nodev_but_dev_itself,
    test_git_commit_works_while_hooks_and_config_stay_read_only,
    test_overlapping_background_processes_keep_their_own_facts,
    test_read_only_write_is_denied_and_host_unchanged,
    test_secrets_the_host_creates_or_replaces_while_a_command_runs_stay_unreadable,
    test_timeout_and_abort_report_the_signal_and_never_both,
    test_workspace_boundary_write_outside_is_denied,
)


@pytest.fixture
async def make_executor(make_executor: ExecutorFactory) -> AsyncIterator[ExecutorFactory]:
    made: list[SandboxBashExecutor] = []

    def factory(**kw: Any) -> SandboxBashExecutor:
        kw.setdefault("spawn_helper", True)
        ex = make_executor(**kw)
        made.append(ex)
        return ex

    yield factory
    for ex in made:
        assert ex._services.helper_failure is None
        assert ex._services._helper is not None, "no command went through the helper"


# Reads every readable mapping of a process, through /proc/<pid>/mem, for a byte string
# given reversed (so this command's own request never carries it).
MEMORY_SCAN = r"""
import sys
needle = sys.argv[1][::-1].encode()
def scan(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError as exc:
        return f"denied:{exc.errno}"
    for line in maps:
        span, perms = line.split()[:2]
        if "r" not in perms:
            continue
        low, high = (int(x, 16) for x in span.split("-"))
        try:
            mem.seek(low)
            if needle in mem.read(high - low):
                return "found"
        except (OSError, OverflowError, ValueError):
            continue
    return "absent"
print(scan(1), scan("self"))
"""


async def test_pid_1_holds_no_other_commands_request_a_command_can_read(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    """The helper's memory holds each command's request (its environment) while it forks:
    nothing of an earlier command's is readable from a later one's PID 1 (bwrap, or the
    bash that waits for the command under Landlock: both exec'd, nothing of the helper's)."""
    ex = make_executor()
    secret = "bsx-other-command-" + os.urandom(8).hex()
    first = await ex.run(
        ex.resolve(BashExecRequest(command="true", workdir=str(workspace), env={"TOKEN": secret}))
    )
    assert first.exit_code == 0
    probe = await ex.run(
        ex.resolve(
            BashExecRequest(
                command=f"python3 -c '{MEMORY_SCAN}' {secret[::-1]}", workdir=str(workspace)
            )
        )
    )
    pid1, own = probe.stdout.text.split()
    # The control: the same scan finds the needle in the scanner's own memory (it holds the
    # needle it computed), so a readable PID 1 holding it would be found.
    assert own == "found", probe.stdout.text + probe.stderr.text
    assert pid1 != "found", probe.stdout.text


async def test_pid_1_waits_for_the_command_reaps_and_takes_the_rest_along(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    """Whatever PID 1 is (bwrap, or a waiting bash under Landlock): the command is PID 2 and
    signals itself, its status (128+n for signal n) is the result's, an orphan it leaves is
    reaped meanwhile and killed when it ends."""
    ex = make_executor()

    async def run(command: str) -> BashRunResult:
        request = BashExecRequest(
            command=command, workdir=str(workspace), sandbox_mode="workspace-write"
        )
        return await ex.run(ex.resolve(request))

    assert (await run("exit 7")).exit_code == 7
    assert (await run("kill $$")).exit_code == 128 + signal.SIGTERM
    assert (await run("kill -KILL $$")).exit_code == 128 + signal.SIGKILL
    # An orphan that exited is reaped (no zombie left in the namespace), and one still
    # running is killed as the command ends: its write never lands on the host.
    result = await run(
        "(true &); (sleep 0.3; echo late > late.txt) & sleep 0.1; echo $$; "
        "ps -o stat= -p 1 -N | grep -c Z; exit 5"
    )
    assert result.exit_code == 5
    assert result.stdout.text.split() == ["2", "0"], result.stdout.text + result.stderr.text
    await asyncio.sleep(0.6)
    assert not (workspace / "late.txt").exists()
    # The control: the same write, waited for, lands.
    assert (await run("(sleep 0.3; echo late > late.txt) & wait")).exit_code == 0
    assert (workspace / "late.txt").read_text() == "late\n"
