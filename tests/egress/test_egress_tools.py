"""Real package managers and git inside a namespace whose only way out is the proxy.

Each tool gets exactly the grant's `environment()` (plus a private HOME, and its own config
turned off), and the executor's base list is empty: a tool that dropped the token, or went
around the proxy, would fail. The upstream's request log shows what reached it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bash_sandbox.egress import EgressProxy, ProxyGrant
from tests.egress.conftest import TEST_NAMES, Namespace, ProxyFactory, clean_env
from tests.egress.servers import (
    ThrowawayCA,
    UpstreamServer,
    listening_socket_in_netns,
    make_dumb_git_repo,
    make_simple_index,
    npm_packument,
)


@pytest.fixture
def ns_proxy(make_proxy: ProxyFactory, namespace: Namespace) -> EgressProxy:
    """A proxy listening inside ``namespace``, with an empty base list."""
    return make_proxy(listen=listening_socket_in_netns(namespace.fd))


def npm_view(
    namespace: Namespace, registry: str, grant: ProxyGrant, ca: ThrowawayCA, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """`npm view egress-probe version` inside ``namespace``, with the grant's proxy, the
    test CA, and no user or global npm config of the host."""
    env = clean_env(
        tmp_path,
        {
            **grant.environment(),
            "npm_config_userconfig": str(tmp_path / "user-npmrc"),
            "npm_config_globalconfig": str(tmp_path / "global-npmrc"),
            "npm_config_cache": str(tmp_path / "npm-cache"),
            "npm_config_cafile": str(ca.ca_file),
            "npm_config_update_notifier": "false",
            "npm_config_fetch_retries": "0",
        },
    )
    argv = ["npm", "view", "egress-probe", "version", "--registry", registry]
    return namespace.run(argv, env, timeout=120)


def test_pip_download_from_an_allowed_https_index(
    ns_proxy: EgressProxy, namespace: Namespace, ca: ThrowawayCA, tmp_path: Path
) -> None:
    root = tmp_path / "index"
    wheel = make_simple_index(root)
    with UpstreamServer(root, tls=ca.server_context(TEST_NAMES)) as index:
        grant = ns_proxy.register(("pkg.test",))
        dest = tmp_path / "dest"
        env = clean_env(
            tmp_path,
            {**grant.environment(), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"},
        )
        result = namespace.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--index-url",
                index.url("pkg.test", "/simple/"),
                "--cert",
                str(ca.ca_file),
                "-d",
                str(dest),
                "egress-probe",
            ],
            env,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        served = root / "simple" / "egress-probe" / wheel
        assert (
            hashlib.sha256((dest / wheel).read_bytes()).digest()
            == hashlib.sha256(served.read_bytes()).digest()
        )
        assert "/simple/egress-probe/" in [r.path for r in index.requests]
        assert grant.denials() == []


def test_npm_view_against_an_allowed_registry(
    ns_proxy: EgressProxy, namespace: Namespace, ca: ThrowawayCA, tmp_path: Path
) -> None:
    root = tmp_path / "registry"
    root.mkdir()
    with UpstreamServer(root, tls=ca.server_context(TEST_NAMES)) as registry:
        tarball = registry.url("registry.test", "/egress-probe/-/egress-probe-1.2.3.tgz")
        registry.route("/egress-probe", npm_packument("egress-probe", "1.2.3", tarball))
        grant = ns_proxy.register(("registry.test",))
        result = npm_view(namespace, registry.url("registry.test", "/"), grant, ca, tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip() == "1.2.3"
        assert [r.path for r in registry.requests] == ["/egress-probe"]


def test_npm_to_a_registry_off_the_list_is_denied_and_recorded(
    ns_proxy: EgressProxy, namespace: Namespace, ca: ThrowawayCA, tmp_path: Path
) -> None:
    with UpstreamServer(tmp_path, tls=ca.server_context(TEST_NAMES)) as registry:
        grant = ns_proxy.register(("registry.test",))
        result = npm_view(namespace, registry.url("evil.test", "/"), grant, ca, tmp_path)
        assert result.returncode != 0
        assert registry.requests == []
        assert {(d.host, d.port) for d in grant.denials()} == {("evil.test", registry.port)}


def test_git_ls_remote_over_dumb_http(
    ns_proxy: EgressProxy, namespace: Namespace, tmp_path: Path
) -> None:
    root = tmp_path / "git"
    root.mkdir()
    head = make_dumb_git_repo(root)
    with UpstreamServer(root) as server:
        grant = ns_proxy.register(("git.test",))
        env = clean_env(
            tmp_path,
            {**grant.environment(), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"},
        )
        result = namespace.run(
            ["git", "ls-remote", server.url("git.test", "/probe.git")], env, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert f"{head}\tHEAD" in result.stdout
        assert any(r.path.startswith("/probe.git/info/refs") for r in server.requests)
        # GIT_HTTP_PROXY_AUTHMETHOD=basic: git sent the token (the base list is empty).
        assert grant.denials() == []


def test_a_dev_server_on_the_namespace_loopback_bypasses_the_proxy(
    ns_proxy: EgressProxy, namespace: Namespace, tmp_path: Path
) -> None:
    grant = ns_proxy.register(("pkg.test",))
    (tmp_path / "dev.txt").write_text("dev server\n")
    script = (
        # `cd` first: `cd X && server &` would background a subshell, and killing it
        # would leave the server running.
        f"cd {tmp_path} || exit 1; {sys.executable} -m http.server 8765 --bind 127.0.0.1 "
        ">/dev/null 2>&1 & server=$!; "
        "for _ in $(seq 100); do curl -sS --max-time 2 http://localhost:8765/dev.txt 2>/dev/null"
        " && break; sleep 0.05; done; kill $server"
    )
    result = namespace.run(["bash", "-c", script], clean_env(tmp_path, grant.environment()))
    assert result.stdout.strip() == "dev server"
    assert grant.denials() == []
