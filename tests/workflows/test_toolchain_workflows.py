"""Toolchains beyond Python, Node and C: cargo, go, cmake and uv, and a headless browser.

Each builds and tests a small project the way a developer would, in workspace-write (the
build lands in the workspace) and in read-only (the build goes to the private /tmp), and then
checks from outside: the workspace holds exactly what the build writes, the host's own
caches of that tool (`~/.cargo`, `~/.cache/go-build`, `~/.cache/uv`, Chromium's profile) are
unchanged, and nothing a command put in its /tmp is on the host's.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from tests.workflows.conftest import HostCaches, Workflow
from tests.workflows.workspaces import (
    CACHE_IS_WRITABLE,
    PAGE_RENDERED,
    describe,
    describe_process,
    wait_for_server,
)

MODES = ("read-only", "workspace-write")


def _scratch(name: str) -> str:
    """A unique path in the command's private /tmp, so the host side can be checked."""
    return f"/tmp/{name}-{uuid.uuid4().hex}"


# -- cargo -----------------------------------------------------------------------------------


async def test_cargo_builds_runs_and_tests_in_workspace_write(rust_workflow: Workflow) -> None:
    host = HostCaches(".cargo")
    ex = rust_workflow.executor("workspace-write")
    result = await rust_workflow.sh(
        ex, "cargo build --offline && ./target/debug/hello && cargo test --offline"
    )
    assert result.exit_code == 0, describe(result)
    assert "hello from rust 5" in result.stdout.text
    assert "test result: ok. 1 passed" in result.stdout.text
    assert (rust_workflow.root / "target" / "debug" / "hello").is_file()
    assert host.changed() == []
    await rust_workflow.finish(["target*"])


async def test_cargo_builds_in_read_only_with_its_target_in_tmp(rust_workflow: Workflow) -> None:
    host = HostCaches(".cargo")
    target = _scratch("cargo-target")
    ex = rust_workflow.executor("read-only")
    result = await rust_workflow.sh(
        ex,
        f"export CARGO_TARGET_DIR={target} && cargo build --offline && {target}/debug/hello "
        "&& cargo test --offline",
    )
    assert result.exit_code == 0, describe(result)
    assert "hello from rust 5" in result.stdout.text
    assert "test result: ok. 1 passed" in result.stdout.text
    assert not Path(target).exists(), "the build reached the host's /tmp"
    assert host.changed() == []
    await rust_workflow.finish()


# -- go --------------------------------------------------------------------------------------


async def test_go_builds_tests_and_vets_in_workspace_write_with_the_sandboxs_cache(
    go_workflow: Workflow,
) -> None:
    host = HostCaches(".cache/go-build", "go")
    ex = go_workflow.executor("workspace-write")
    result = await go_workflow.sh(
        ex,
        "go build -o hello . && ./hello && go test ./... && go vet ./... && "
        f"cache=$(go env GOCACHE) && {CACHE_IS_WRITABLE}",
    )
    assert result.exit_code == 0, describe(result)
    assert "hello from go 5" in result.stdout.text
    assert "ok  \texample.com/hello" in result.stdout.text
    cache = result.stdout.text.split("cache=")[-1].strip()
    assert not cache.startswith(str(Path("~/.cache/go-build").expanduser())), cache
    assert host.changed() == []
    await go_workflow.finish(["hello"])


async def test_go_builds_and_tests_in_read_only(go_workflow: Workflow) -> None:
    host = HostCaches(".cache/go-build", "go")
    binary = _scratch("go-hello")
    ex = go_workflow.executor("read-only")
    result = await go_workflow.sh(ex, f"go build -o {binary} . && {binary} && go test ./...")
    assert result.exit_code == 0, describe(result)
    assert "hello from go 5" in result.stdout.text
    assert "ok  \texample.com/hello" in result.stdout.text
    assert not Path(binary).exists(), "the build reached the host's /tmp"
    assert host.changed() == []
    await go_workflow.finish()


# -- cmake -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_cmake_configures_builds_and_runs_ctest(mode: str, cmake_workflow: Workflow) -> None:
    # In read-only the build tree goes to the private /tmp, as a developer would point it.
    build = "build" if mode == "workspace-write" else _scratch("cmake-build")
    ex = cmake_workflow.executor(mode)
    result = await cmake_workflow.sh(
        ex,
        f"cmake -S . -B {build} > /dev/null && cmake --build {build} > /dev/null && "
        f"{build}/hello && ctest --test-dir {build} --output-on-failure",
    )
    assert result.exit_code == 0, describe(result)
    assert "hello from cmake" in result.stdout.text
    assert "100% tests passed" in result.stdout.text
    if mode == "workspace-write":
        assert (cmake_workflow.root / "build" / "hello").is_file()
        await cmake_workflow.finish(["build*"])
    else:
        assert not Path(build).exists(), "the build tree reached the host's /tmp"
        await cmake_workflow.finish()


# -- uv --------------------------------------------------------------------------------------


def _uv() -> str:
    """The test environment's uv (a test extra), by absolute path."""
    found = Path(sys.executable).with_name("uv")
    if not found.exists():
        pytest.fail("uv is a test extra (pyproject.toml): scripts/setup installs it")
    return str(found)


@pytest.mark.parametrize("mode", MODES)
async def test_uv_makes_a_venv_installs_offline_and_runs(
    mode: str, plain_workflow: Workflow, wheel_dir: Path
) -> None:
    host = HostCaches(".cache/uv")
    uv = _uv()
    venv = ".venv" if mode == "workspace-write" else _scratch("uv-venv")
    ex = plain_workflow.executor(mode)
    greet = "import tinywheel; print(tinywheel.GREETING)"
    result = await plain_workflow.sh(
        ex,
        f"{uv} venv -q --python {sys.executable} {venv} && "
        f"{uv} pip install -q --offline --no-index --find-links {wheel_dir} "
        f"--python {venv}/bin/python tinywheel && "
        f"{uv} run -q --no-project --python {venv}/bin/python -- python -c '{greet}' && "
        f"cache=$({uv} cache dir) && {CACHE_IS_WRITABLE}",
    )
    assert result.exit_code == 0, describe(result)
    assert "hello from a wheel" in result.stdout.text
    cache = result.stdout.text.split("cache=")[-1].strip()
    assert not cache.startswith(str(Path("~/.cache/uv").expanduser())), cache
    assert host.changed() == []
    if mode == "workspace-write":
        assert (plain_workflow.root / ".venv" / "pyvenv.cfg").is_file()
        await plain_workflow.finish([".venv*"])
    else:
        assert not Path(venv).exists(), "the venv reached the host's /tmp"
        await plain_workflow.finish()


# -- a headless browser ----------------------------------------------------------------------

# Chromium as end-to-end tests start it: headless, a fresh profile in the private /tmp, no
# background traffic. `--no-sandbox`: Chromium's own sandbox needs user namespaces (or a
# setuid helper), which no confined command gets; the sandbox around it is this one.
CHROMIUM = (
    "chromium --headless --no-sandbox --disable-gpu --no-first-run "
    "--disable-background-networking --disable-component-update --disable-sync "
    '--user-data-dir="$(mktemp -d)"'
)


@pytest.mark.parametrize("mode", MODES)
async def test_a_headless_browser_renders_and_shoots_the_dev_servers_page(
    mode: str, web_workflow: Workflow
) -> None:
    host = HostCaches(".config/chromium", ".cache/chromium")
    shot = "shot.png" if mode == "workspace-write" else _scratch("shot") + ".png"
    ex = web_workflow.executor(mode)
    async with web_workflow.dev_server(ex) as (port, server):
        url = f"http://127.0.0.1:{port}/"
        result = await web_workflow.sh(
            ex,
            f"{wait_for_server(url)} && {CHROMIUM} --dump-dom {url} && "
            f"{CHROMIUM} --window-size=320,240 --screenshot={shot} {url} && "
            f"head -c 8 {shot} | od -An -tx1",
        )
        assert result.exit_code == 0, describe(result) + describe_process(server)
        # The page's script ran: the DOM holds what it wrote, and the shot is a PNG.
        assert f'<h1 id="t">{PAGE_RENDERED}</h1>' in result.stdout.text, describe(result)
        assert "89 50 4e 47 0d 0a 1a 0a" in result.stdout.text, describe(result)
    assert host.changed() == []
    if mode == "workspace-write":
        assert (web_workflow.root / "shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        await web_workflow.finish(["shot.png"])
    else:
        assert not Path(shot).exists(), "the screenshot reached the host's /tmp"
        await web_workflow.finish()
