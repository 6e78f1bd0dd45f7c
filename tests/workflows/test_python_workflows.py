"""Python workflows: pytest, temp files, multiprocessing and pip in a project with its venv."""

from __future__ import annotations

from pathlib import Path

from tests.workflows.conftest import HostCaches, Workflow
from tests.workflows.workspaces import CACHE_IS_WRITABLE, describe

# The venv sees this run's site-packages: keep their pytest plugins out of the project's run.
PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 .venv/bin/python -m pytest -q"
# What pytest itself writes into a project it may write.
PYTEST_WRITES = (".pytest_cache*", "*__pycache__*")


async def test_pytest_passes_in_read_only_and_writes_nothing(python_workflow: Workflow) -> None:
    ex = python_workflow.executor("read-only")
    result = await python_workflow.sh(ex, PYTEST)
    assert result.exit_code == 0, describe(result)
    assert "3 passed" in result.stdout.text
    await python_workflow.finish()


async def test_pytest_passes_in_workspace_write(python_workflow: Workflow) -> None:
    ex = python_workflow.executor("workspace-write")
    result = await python_workflow.sh(ex, PYTEST)
    assert result.exit_code == 0, describe(result)
    assert "3 passed" in result.stdout.text
    assert (python_workflow.root / ".pytest_cache").is_dir()
    await python_workflow.finish(PYTEST_WRITES)


async def test_mktemp_and_mkstemp_work_in_read_only_and_stay_private(
    python_workflow: Workflow,
) -> None:
    ex = python_workflow.executor("read-only")
    result = await python_workflow.sh(
        ex,
        'set -e; f=$(mktemp); echo shell > "$f"; cat "$f"; echo "$f"; '
        ".venv/bin/python -c 'import os, tempfile\n"
        'fd, p = tempfile.mkstemp(); os.write(fd, b"py"); os.close(fd)\n'
        "print(open(p).read()); print(p)'",
    )
    assert result.exit_code == 0, describe(result)
    lines = result.stdout.text.splitlines()
    assert lines[0] == "shell" and lines[2] == "py", lines
    for path in (lines[1], lines[3]):
        assert not Path(path).exists(), f"{path} reached the host"
    await python_workflow.finish()


async def test_multiprocessing_pool_queue_lock_and_process_pool_work(
    python_workflow: Workflow,
) -> None:
    # Semaphores behind Queue and Lock live in /dev/shm: a private writable one is needed.
    ex = python_workflow.executor("read-only")
    result = await python_workflow.sh(ex, ".venv/bin/python mp_check.py")
    assert result.exit_code == 0, describe(result)
    assert result.stdout.text == "multiprocessing ok\n"
    await python_workflow.finish()


async def test_pip_installs_into_the_workspace_venv_with_a_writable_cache(
    python_workflow: Workflow, wheel_dir: Path, host_caches: HostCaches
) -> None:
    ex = python_workflow.executor("workspace-write")
    result = await python_workflow.sh(
        ex,
        f".venv/bin/python -m pip install --no-index --find-links {wheel_dir} tinywheel && "
        ".venv/bin/python -c 'import tinywheel; print(tinywheel.GREETING)' && "
        f"cache=$(.venv/bin/python -m pip cache dir) && {CACHE_IS_WRITABLE}",
    )
    assert result.exit_code == 0, describe(result)
    assert "cache has been disabled" not in result.stderr.text, describe(result)
    assert "hello from a wheel" in result.stdout.text
    cache = result.stdout.text.split("cache=")[-1].strip()
    assert not cache.startswith(str(Path("~/.cache/pip").expanduser())), cache
    assert host_caches.changed() == []
    await python_workflow.finish([".venv/lib/*"])
