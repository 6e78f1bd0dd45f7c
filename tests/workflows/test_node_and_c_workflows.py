"""Node and C workflows: npm scripts and installs with their cache, gcc and make."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.workflows.conftest import HostCaches, Workflow
from tests.workflows.workspaces import CACHE_IS_WRITABLE, describe

# npm writes these into a project it installs into.
NPM_INSTALL_WRITES = ("node_modules*", "package.json", "package-lock.json")


async def test_npm_test_and_require_work_in_read_only(node_workflow: Workflow) -> None:
    ex = node_workflow.executor("read-only")
    result = await node_workflow.sh(
        ex, "npm test && node -e \"console.log(require('tiny-greet').greet('ro'))\""
    )
    assert result.exit_code == 0, describe(result)
    assert "node test ok" in result.stdout.text
    assert result.stdout.text.endswith("hello, ro\n")
    await node_workflow.finish()


async def test_npm_install_uses_a_writable_cache_and_never_the_hosts(
    node_workflow: Workflow, node_packages: dict[str, Path], host_caches: HostCaches
) -> None:
    ex = node_workflow.executor("workspace-write")
    tarball = node_packages["tiny-other"]
    result = await node_workflow.sh(
        ex,
        f"npm install --no-audit --no-fund {tarball} && "
        "node -e \"console.log(require('tiny-other').greet('rw'))\" && "
        f"cache=$(npm config get cache) && {CACHE_IS_WRITABLE}",
    )
    assert result.exit_code == 0, describe(result)
    assert "hi, rw" in result.stdout.text
    assert (node_workflow.root / "node_modules" / "tiny-other" / "index.js").is_file()
    cache = result.stdout.text.split("cache=")[-1].strip()
    assert not cache.startswith(str(Path("~/.npm").expanduser())), cache
    assert host_caches.changed() == []
    await node_workflow.finish(NPM_INSTALL_WRITES)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_gcc_builds_into_tmp_and_runs(mode: str, c_workflow: Workflow) -> None:
    binary = f"/tmp/x-{uuid.uuid4().hex}"  # unique, so the host side can be checked
    ex = c_workflow.executor(mode)
    result = await c_workflow.sh(ex, f"gcc -o {binary} main.c && {binary}")
    assert result.exit_code == 0, describe(result)
    assert result.stdout.text == "hello from c\n"
    assert not Path(binary).exists(), "the build reached the host's /tmp"
    await c_workflow.finish()


async def test_make_builds_the_project_in_workspace_write(c_workflow: Workflow) -> None:
    ex = c_workflow.executor("workspace-write")
    result = await c_workflow.sh(ex, "make -s && ./hello")
    assert result.exit_code == 0, describe(result)
    assert result.stdout.text == "hello from c\n"
    assert (c_workflow.root / "hello").is_file()
    await c_workflow.finish(["hello"])
