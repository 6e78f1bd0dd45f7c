"""Fixtures for egress tests: a throwaway CA, upstream servers, and started proxies.

Every proxy made here is closed at teardown, so one failing test leaves no thread behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.egress import EgressProxy, ProxyLimits, Resolver, StaticResolver
from tests.egress.servers import ThrowawayCA, UpstreamServer, free_port_socket, resolver_for
from tests.sandbox.conftest import LINUX_BACKENDS, require_backend

TEST_NAMES = ("pkg.test", "files.pkg.test", "other.test", "evil.test", "registry.test", "git.test")

ProxyFactory = Callable[..., EgressProxy]
# DNS as a stub for `make_pinned_executor`: answers unpinned, like a hostile or
# split-horizon server would.
DNS = StaticResolver(
    {
        "registry.test": "8.8.8.8",  # the hosts-file pin must win over this
        "lan.test": "10.9.8.7",
        "loop.test": "127.0.0.1",
        "meta.test": "169.254.169.254",
    },
    pinned=False,
)


@pytest.fixture(scope="session")
def ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    return ThrowawayCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "hello.txt").write_text("hello through the proxy\n")
    return root


@pytest.fixture
def site(site_root: Path) -> Iterator[UpstreamServer]:
    with UpstreamServer(site_root) as server:
        yield server


@pytest.fixture
def tls_site(site_root: Path, ca: ThrowawayCA) -> Iterator[UpstreamServer]:
    with UpstreamServer(site_root, tls=ca.server_context(TEST_NAMES)) as server:
        yield server


@pytest.fixture
def make_proxy() -> Iterator[ProxyFactory]:
    made: list[EgressProxy] = []

    def factory(
        allow: Sequence[str] = (),
        *,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
        listen: object = None,
    ) -> EgressProxy:
        sock = listen if listen is not None else free_port_socket()
        proxy = EgressProxy(
            sock,  # type: ignore[arg-type]
            allow=tuple(allow),
            resolver=resolver if resolver is not None else resolver_for(TEST_NAMES),
            limits=limits,
        )
        made.append(proxy)
        proxy.start()
        return proxy

    yield factory
    for proxy in made:
        proxy.close()


def curl(
    url: str,
    env: dict[str, str],
    *args: str,
    ca_file: Path | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """curl with the proxy variables in ``env``; prints the body, then the status code."""
    argv = ["curl", "-sS", "-w", "\n%{http_code}", "--max-time", str(int(timeout)), *args]
    if ca_file is not None:
        argv += ["--cacert", str(ca_file)]
    return subprocess.run(
        [*argv, url],
        check=False,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout + 5,
    )


def status_and_body(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    body, _, status = result.stdout.rpartition("\n")
    return status, body


class Namespace:
    """A fresh network namespace (only `lo`, no route out) and a way to run clients in it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def run(
        self, argv: Sequence[str], env: dict[str, str], *, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the namespace, with exactly ``env`` (no host tool config)."""
        nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        return subprocess.run(
            [nsenter, f"--net=/proc/self/fd/{self.fd}", "--", *argv],
            env=env,
            pass_fds=(self.fd,),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root on Linux: the namespace tests must run")
        pytest.skip("making a network namespace here needs root on Linux")
    import tempfile

    from bash_sandbox.linux.namespaces import ScratchPaths, create_namespaces
    from bash_sandbox.state import remove_tree

    # The executor's own namespace maker: a network namespace with only `lo`, up.
    scratch = tempfile.mkdtemp(prefix="egress-ns-")
    paths = ScratchPaths(*(os.path.join(scratch, n) for n in ("tmp", "shm", "pts")))
    for path in (paths.tmp, paths.shm, paths.pts):
        os.mkdir(path)
    made = create_namespaces(paths, tmp_bytes=1 << 20, shm_bytes=1 << 20)
    try:
        yield Namespace(made.net)
    finally:
        for fd in (made.mnt, made.net, made.tmp, made.shm, made.pts, made.listener):
            os.close(fd)
        remove_tree(scratch)


def clean_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """A minimal environment: no proxy, pip, npm or git settings of the host leak in."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        **extra,
    }


ExecutorFactory = Callable[..., SandboxBashExecutor]


@pytest.fixture(params=LINUX_BACKENDS)
def egress_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def hosts_file(tmp_path: Path) -> Path:
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n127.0.0.1 registry.test  # the operator's mirror\n")
    return path


@pytest.fixture
async def make_pinned_executor(
    egress_backend: str, tmp_path: Path, hosts_file: Path
) -> AsyncIterator[ExecutorFactory]:
    made: list[SandboxBashExecutor] = []
    workspace = tmp_path / "ws"
    workspace.mkdir()

    def factory(**kw: Any) -> SandboxBashExecutor:
        kw.setdefault("backend", egress_backend)
        kw.setdefault("workspace_root", str(workspace))
        kw.setdefault("grace_ms", 500)
        kw.setdefault("hosts_file", str(hosts_file))
        ex = SandboxBashExecutor(egress_resolver=DNS, **kw)
        made.append(ex)
        return ex

    yield factory
    for ex in made:
        await ex.aclose()
