"""Fixtures for egress tests: a throwaway CA, upstream servers, and started proxies.

Every proxy made here is closed at teardown, so one failing test leaves no thread behind.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from bash_sandbox.egress import EgressProxy, ProxyLimits, Resolver
from tests.egress.servers import ThrowawayCA, UpstreamServer, free_port_socket, resolver_for

TEST_NAMES = ("pkg.test", "files.pkg.test", "other.test", "evil.test", "registry.test", "git.test")

ProxyFactory = Callable[..., EgressProxy]


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
