"""A chosen part of the confinement tests, run again with the spawn helper on.

The tests are the very functions of `test_executor_confined.py`; this module's
`make_executor` turns the helper on for every executor they make, and checks that each made
executor really spawned through it. The whole suites run on the helper path with
``BASH_SANDBOX_TEST_SPAWN_HELPER=1`` (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor
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
