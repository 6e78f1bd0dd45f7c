"""Fixtures of the workflow suite: a backend, a realistic workspace, executors on it.

Every test is parametrised over the Linux backends (bwrap, landlock). `Workflow.finish()`
closes the executors and then checks from outside: the executor's spill and state dirs are
gone (they were empty), and the host workspace holds exactly what the commands were meant to
write. The executors' temp dir (`tempfile.tempdir`) is the test's own, so leftovers are
attributable; the commands themselves see the host's usual environment.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest, BashProcess, BashRunResult
from tests.sandbox.conftest import require_backend
from tests.workflows.workspaces import (
    WorkspaceAudit,
    build_c_project,
    build_cmake_project,
    build_git_repository,
    build_go_project,
    build_node_project,
    build_python_project,
    build_rust_project,
    build_web_page,
    build_wheel,
    free_host_port,
    have,
    host_tree_digest,
    pack_node_package,
    remove_tree,
)

LINUX_BACKENDS = ("bwrap", "landlock")
COMMAND_TIMEOUT_MS = 90_000
PROJECTS_DIR = "/var/tmp"


@pytest.fixture(params=LINUX_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def executor_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where executors keep state and spill files: inside the test's tmp, in process only."""
    path = tmp_path / "executor-tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


class Workflow:
    """One test's workspace, its executors, and the checks after them."""

    def __init__(
        self, root: Path, backend: str, executor_tmp: Path, shared_dirs: frozenset[Path]
    ) -> None:
        self.root = root
        self.backend = backend
        self.executor_tmp = executor_tmp
        self.shared_dirs = shared_dirs
        self.audit = WorkspaceAudit(root)
        self.executors: list[SandboxBashExecutor] = []

    def executor(self, mode: str = "workspace-write", **kw: Any) -> SandboxBashExecutor:
        kw.setdefault("backend", self.backend)
        kw.setdefault("workspace_root", str(self.root))
        kw.setdefault("grace_ms", 1000)
        ex = SandboxBashExecutor(mode=mode, **kw)
        self.executors.append(ex)
        return ex

    def request(self, command: str, **kw: Any) -> BashExecRequest:
        kw.setdefault("workdir", str(self.root))
        kw.setdefault("timeout_ms", COMMAND_TIMEOUT_MS)
        return BashExecRequest(command=command, **kw)

    async def sh(self, ex: SandboxBashExecutor, command: str, **kw: Any) -> BashRunResult:
        return await ex.run(ex.resolve(self.request(command, **kw)))

    async def start(self, ex: SandboxBashExecutor, command: str, **kw: Any) -> BashProcess:
        return await ex.start(ex.resolve(self.request(command, **kw)))

    @contextlib.asynccontextmanager
    async def dev_server(self, ex: SandboxBashExecutor) -> AsyncIterator[tuple[int, BashProcess]]:
        """`python3 -m http.server` on a free loopback port serving the workspace, started
        with ``ex``; once the body is done, checked unreachable from the host while it still
        runs (isolated: it listens in the executor's namespace), then killed."""
        port = free_host_port()
        server = await self.start(
            ex, f"exec python3 -m http.server {port} --bind 127.0.0.1 --directory ."
        )
        try:
            yield port, server
            with socket.socket() as probe:
                probe.settimeout(2)
                assert probe.connect_ex(("127.0.0.1", port)) != 0, "the server is on the host"
        finally:
            server.kill()
            await server.wait()

    async def finish(self, expected: Iterable[str] = ()) -> None:
        """Close every executor, then check the host: no empty spill or state dir of
        these executors is left, and the workspace holds only what the commands were meant
        to write."""
        for ex in self.executors:
            await ex.aclose()
        self.executors.clear()
        leftovers = [
            str(p.relative_to(self.executor_tmp))
            for p in empty_dirs(self.executor_tmp)
            if p not in self.shared_dirs
        ]
        changes = self.audit.unexpected_changes(expected)
        assert (leftovers, changes) == ([], []), (
            f"empty executor dirs left after aclose(): {leftovers}; "
            f"unexpected workspace changes: {changes}"
        )


WorkflowFactory = Callable[[Callable[[Path], None] | None], Workflow]


def empty_dirs(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_dir() and not any(p.iterdir())]


async def shared_executor_dirs(backend: str, executor_tmp: Path, scratch: Path) -> frozenset[Path]:
    """The directories every executor of this user shares (per-user bases), found from
    outside: what one throw-away executor leaves behind after `aclose()`. A directory of a
    test's own executor has another (random) name, so it is never mistaken for one."""
    scratch.mkdir()
    async with SandboxBashExecutor(backend=backend, workspace_root=str(scratch)) as ex:
        await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(scratch))))
    remove_tree(scratch)
    return frozenset(p for p in executor_tmp.rglob("*") if p.is_dir())


@pytest.fixture
def project_parent() -> Iterator[Path]:
    """Where the workspace lives: a directory this test makes under /var/tmp and removes.

    Not under pytest's /tmp/pytest-of-<user>: a project's own pytest would then share its
    temp root with ours, which no real project does.
    """
    path = Path(tempfile.mkdtemp(prefix="bash-sandbox-workflow-", dir=PROJECTS_DIR))
    yield path
    remove_tree(path)  # also clears read-only dirs a command may have left


@pytest.fixture
async def make_workflow(
    backend: str, project_parent: Path, executor_tmp: Path
) -> AsyncIterator[WorkflowFactory]:
    made: list[Workflow] = []
    shared = await shared_executor_dirs(backend, executor_tmp, project_parent / "scratch")

    def factory(build: Callable[[Path], None] | None = None) -> Workflow:
        root = project_parent / "ws"
        root.mkdir()
        if build is not None:
            build(root)
        flow = Workflow(Path(os.path.realpath(root)), backend, executor_tmp, shared)
        made.append(flow)
        return flow

    yield factory
    for flow in made:  # a test that failed before finish(): still kill what it started
        for ex in flow.executors:
            await ex.aclose()


@pytest.fixture
def plain_workflow(make_workflow: WorkflowFactory) -> Workflow:
    return make_workflow(lambda root: (root / "notes.txt").write_text("notes\n") and None)


@pytest.fixture
def python_workflow(make_workflow: WorkflowFactory) -> Workflow:
    return make_workflow(build_python_project)


@pytest.fixture
def c_workflow(make_workflow: WorkflowFactory) -> Workflow:
    if not have("gcc", "make"):
        pytest.skip("gcc and make are installed by scripts/setup")
    return make_workflow(build_c_project)


def require_tools(*tools: str) -> None:
    """Skip without ``tools``, except in CI, where scripts/setup installs them: fail."""
    missing = [tool for tool in tools if not have(tool)]
    if missing and os.environ.get("CI"):
        pytest.fail(f"{missing} must be installed in CI (scripts/setup installs them)")
    if missing:
        pytest.skip(f"{missing} are installed by scripts/setup")


@pytest.fixture
def rust_workflow(make_workflow: WorkflowFactory) -> Workflow:
    require_tools("cargo")
    return make_workflow(build_rust_project)


@pytest.fixture
def go_workflow(make_workflow: WorkflowFactory) -> Workflow:
    require_tools("go")
    return make_workflow(build_go_project)


@pytest.fixture
def cmake_workflow(make_workflow: WorkflowFactory) -> Workflow:
    require_tools("cmake", "gcc", "make")
    return make_workflow(build_cmake_project)


@pytest.fixture
def web_workflow(make_workflow: WorkflowFactory) -> Workflow:
    require_tools("chromium", "curl")
    return make_workflow(build_web_page)


@pytest.fixture
def git_workflow(make_workflow: WorkflowFactory) -> Workflow:
    if not have("git"):
        pytest.skip("git is installed by scripts/setup")
    return make_workflow(build_git_repository)


@pytest.fixture(scope="session")
def shared_parent() -> Iterator[Path]:
    """Session-wide inputs (packed npm packages, a wheel) beside the projects, not under
    /tmp: bwrap's private /tmp in workspace-write hides the host's (see README)."""
    path = Path(tempfile.mkdtemp(prefix="bash-sandbox-workflow-inputs-", dir=PROJECTS_DIR))
    yield path
    remove_tree(path)


@pytest.fixture(scope="session")
def node_packages(shared_parent: Path) -> dict[str, Path]:
    """Two packed npm packages (made once, with a throw-away cache)."""
    require_tools("node", "npm")
    directory = shared_parent / "npm-packages"
    directory.mkdir()
    cache = directory / "cache"
    return {
        "tiny-greet": pack_node_package(directory, cache, "tiny-greet", "hello"),
        "tiny-other": pack_node_package(directory, cache, "tiny-other", "hi"),
    }


@pytest.fixture
def node_workflow(
    make_workflow: WorkflowFactory, node_packages: dict[str, Path], project_parent: Path
) -> Workflow:
    cache = project_parent / "fixture-npm-cache"
    return make_workflow(lambda root: build_node_project(root, node_packages["tiny-greet"], cache))


@pytest.fixture(scope="session")
def wheel_dir(shared_parent: Path) -> Path:
    directory = shared_parent / "wheels"
    directory.mkdir()
    build_wheel(directory)
    return directory


class HostCaches:
    """The host's own caches of a tool (npm's and pip's unless named: paths below the
    home), to prove a sandboxed build or install left them alone."""

    def __init__(self, *below_home: str) -> None:
        home = Path(os.path.expanduser("~"))
        self.paths = [home / p for p in (below_home or (".npm", ".cache/pip"))]
        self.before = {p: host_tree_digest(p) for p in self.paths}

    def changed(self) -> list[str]:
        return [str(p) for p in self.paths if host_tree_digest(p) != self.before[p]]


@pytest.fixture
def host_caches() -> HostCaches:
    return HostCaches()
