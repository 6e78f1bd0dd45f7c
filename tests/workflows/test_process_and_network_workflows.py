"""Processes and the network: a dev server reached by the next command, a pty, `ps`, and
package managers under the isolated network failing fast and saying why."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from bash_sandbox.linux import sandbox_init
from tests.workflows.conftest import Workflow
from tests.workflows.workspaces import describe, describe_process, have, wait_for_server

# How long a package manager may take to give up under `isolated` before users stop waiting.
FAST_FAILURE_S = 10.0


async def test_a_dev_server_from_start_is_reached_by_the_next_run(
    plain_workflow: Workflow,
) -> None:
    ex = plain_workflow.executor("read-only")
    async with plain_workflow.dev_server(ex) as (port, server):
        # The server needs a moment to bind: poll from inside, bounded.
        url = f"http://127.0.0.1:{port}/notes.txt"
        result = await plain_workflow.sh(
            ex, f"{wait_for_server(url)} && curl -sf {url}", timeout_ms=90_000
        )
        assert result.exit_code == 0, describe(result) + describe_process(server)
        assert result.stdout.text == "notes\n"
    assert server.status == "killed"
    await plain_workflow.finish()


async def test_a_pty_needing_command_works(plain_workflow: Workflow) -> None:
    if not have("script"):
        pytest.skip("script (util-linux) is installed by scripts/setup")
    ex = plain_workflow.executor("read-only")
    result = await plain_workflow.sh(ex, "script -qc 'tty; echo in-pty' /dev/null")
    assert result.exit_code == 0, describe(result)
    assert "in-pty" in result.stdout.text
    assert "/dev/pts/" in result.stdout.text
    await plain_workflow.finish()


async def test_ps_shows_only_the_commands_own_processes(plain_workflow: Workflow) -> None:
    if not have("ps"):
        pytest.skip("ps (procps) is installed by scripts/setup")
    marker = f"31.{os.getpid()}{int(time.monotonic() * 1000) % 100000}"
    host_sleep = subprocess.Popen(["sleep", marker])
    try:
        ex = plain_workflow.executor("read-only")
        result = await plain_workflow.sh(ex, "ps -eo pid=,args=")
    finally:
        host_sleep.kill()
        host_sleep.wait()
    assert result.exit_code == 0, describe(result)
    listed = result.stdout.text
    assert f"sleep {marker}" not in listed, "a host process is visible"
    commands = [line.split(None, 1)[1] for line in listed.splitlines() if line.strip()]
    # The sandbox's own init (bwrap, or Landlock's compiled one, exec'd from the descriptor
    # the child held), the command's shell and ps itself: nothing else.
    own = ("/usr/bin/bwrap ", "bwrap ", f"{sandbox_init.EXEC_PATH} ")
    own += ("/usr/bin/bash ", "/bin/bash ", "bash ", "ps ")
    others = [c[:80] for c in commands if not c.startswith(own)]
    assert others == [], f"{len(others)} processes that are not the command's: {others[:5]}"
    await plain_workflow.finish()


@pytest.mark.parametrize(
    ("tool", "command"),
    [
        ("npm", "npm view left-pad version"),
        # As an agent runs it: pip reads the sandbox's settings from the environment (a
        # `--isolated` pip ignores them and retries for ~10 s). The host's index settings
        # pass through without credentials (a local mirror may serve the command offline),
        # so the package is one no mirror has: pip must ask the network for it.
        ("pip", "python3 -m pip download --no-deps -d /tmp/dl bash-sandbox-no-such-package"),
    ],
)
async def test_package_managers_fail_fast_under_isolated_and_say_network_denied(
    tool: str, command: str, plain_workflow: Workflow
) -> None:
    if not have(tool if tool == "npm" else "python3"):
        pytest.skip(f"{tool} is not installed")
    ex = plain_workflow.executor("workspace-write", network="isolated")
    started = time.monotonic()
    # Bounded: a hang shows up as timed_out after 20 s instead of stalling the suite.
    result = await plain_workflow.sh(ex, command, timeout_ms=20_000)
    elapsed = time.monotonic() - started
    assert result.exit_code not in (0, None), describe(result)
    assert not result.timed_out
    assert elapsed < FAST_FAILURE_S, f"took {elapsed:.1f} s to fail; {describe(result)}"
    assert result.sandbox is not None and result.sandbox.network_denied, describe(result)
    await plain_workflow.finish()
