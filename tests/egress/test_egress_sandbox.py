"""End to end: real clients inside the real `SandboxBashExecutor` reach the allowlist through
the executor's egress proxy, and nothing else.

Both Linux backends, offline: the upstreams (`tests.egress.servers`) listen on the host's
127.0.0.1, and the test host names reach them only through the resolver injected into the
executor. Every client (curl, Python urllib, pip, npm, git) runs inside the sandbox with the
proxy variables the executor gives its command. Each test checks the world from outside the
sandbox: the upstream's request log, the result's denials, what the host and another
executor reach at the proxy's port, and after `aclose()` this process's descriptors, threads
and the processes in the executor's network namespace.

The executor's base list is `BASE`; the tools' hosts come in through a per-call policy, so a
tool that dropped the grant's token would be served under the base list and refused.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError
from bash_sandbox.egress import StaticResolver
from bash_seam import (
    BashExecRequest,
    BashRunResult,
    DenialEvidence,
    DenialKind,
    InvalidRequestError,
    SandboxDenial,
)
from policies import SandboxPolicy
from tests.egress.conftest import TEST_NAMES
from tests.egress.servers import (
    ThrowawayCA,
    UpstreamServer,
    make_dumb_git_repo,
    make_simple_index,
    npm_packument,
)
from tests.sandbox.conftest import LINUX_BACKENDS, require_backend

BASE = ("pkg.test",)
# `private.test` is answered like DNS (not pinned) with a loopback address: the host's, where
# the upstream listens, so a proxy that wrongly allowed it would show in the upstream's log.
RESOLVER = StaticResolver(
    dict.fromkeys(TEST_NAMES, "127.0.0.1"),
    fallback=StaticResolver({"private.test": "127.0.0.1"}, pinned=False),
)
# Prints the port of the first socket listening on 127.0.0.1 (the proxy, in a fresh namespace).
FIND_LISTENER = (
    "print(next(int(f[1][9:], 16) for f in (l.split() for l in open('/proc/net/tcp'))"
    " if f[1].startswith('0100007F:') and f[3] == '0A'))"
)
# curl's connect failure: nothing accepted the connection.
CURL_COULD_NOT_CONNECT = 7

ExecutorFactory = Callable[..., SandboxBashExecutor]


@pytest.fixture(params=LINUX_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def ca_env(ca: ThrowawayCA, workspace: Path) -> dict[str, str]:
    """The test CA for every client, from a copy the sandbox can read (in the workspace)."""
    ca_file = workspace / "throwaway-ca.pem"
    shutil.copyfile(ca.ca_file, ca_file)
    names = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
    return {**dict.fromkeys(names, str(ca_file)), "PIP_CERT": str(ca_file)}


@pytest.fixture
async def make_executor(backend: str, workspace: Path) -> AsyncIterator[ExecutorFactory]:
    """Executors on the parametrised backend with the base list and the test resolver."""
    made: list[SandboxBashExecutor] = []

    def factory(**kw: Any) -> SandboxBashExecutor:
        kw.setdefault("backend", backend)
        kw.setdefault("workspace_root", str(workspace))
        kw.setdefault("grace_ms", 500)
        kw.setdefault("allow_domains", BASE)
        ex = SandboxBashExecutor(egress_resolver=RESOLVER, **kw)
        made.append(ex)
        return ex

    yield factory
    for ex in made:
        await ex.aclose()  # idempotent: tests that close their own executor close it again


async def sh(
    ex: SandboxBashExecutor,
    command: str,
    *,
    env: dict[str, str] | None = None,
    policy: SandboxPolicy | None = None,
) -> BashRunResult:
    request = BashExecRequest(command=command, env=env, sandbox_policy=policy, timeout_ms=90_000)
    return await ex.run(ex.resolve(request))


def curl(url: str, *args: str) -> str:
    """A curl command line printing the body, then the status code on its own line."""
    argv = ["curl", "-sS", "--max-time", "20", "-w", r"\n%{http_code}", *args, url]
    return shlex.join(argv)


def status_and_body(result: BashRunResult) -> tuple[str, str]:
    body, _, status = result.stdout.text.rpartition("\n")
    return status, body


def facts_denials(result: BashRunResult) -> tuple[SandboxDenial, ...]:
    assert result.sandbox is not None
    return result.sandbox.denials


def proxy_refusal(host: str, port: int) -> tuple[DenialKind, str, DenialEvidence]:
    return DenialKind.NETWORK_CONNECT, f"{host}:{port}", DenialEvidence.PROXY


def shape(denial: SandboxDenial) -> tuple[DenialKind, str, DenialEvidence]:
    return denial.kind, denial.target, denial.evidence


def with_allowed(ex: SandboxBashExecutor, *extra: str, mode: str | None = None) -> SandboxPolicy:
    """A complete per-call policy: the executor's own, plus ``extra`` allowlist entries."""
    spec = ex.resolve(BashExecRequest(command="true", sandbox_mode=mode))
    assert spec.sandbox_policy is not None
    fields = spec.sandbox_policy.model_dump()
    fields["allow_domains"] = (*fields["allow_domains"], *extra)
    return SandboxPolicy(**fields)


def paths_seen(server: UpstreamServer) -> list[str]:
    return [r.path for r in server.requests]


# -- allowed names work -------------------------------------------------------------------------


async def test_curl_reaches_an_allowed_name_over_http_and_https(
    make_executor: ExecutorFactory,
    site: UpstreamServer,
    tls_site: UpstreamServer,
    ca_env: dict[str, str],
) -> None:
    ex = make_executor()
    plain = await sh(ex, curl(site.url("pkg.test", "/hello.txt")))
    tunnelled = await sh(
        ex, curl(tls_site.url("pkg.test", "/hello.txt"), "--cacert", ca_env["SSL_CERT_FILE"])
    )
    for result in (plain, tunnelled):
        assert status_and_body(result) == ("200", "hello through the proxy\n"), result.stderr.text
        assert facts_denials(result) == ()
    assert paths_seen(site) == ["/hello.txt"]
    assert paths_seen(tls_site) == ["/hello.txt"]
    # Forwarded plain HTTP: the grant's token never leaves the proxy.
    assert "proxy-authorization" not in site.requests[0].headers


async def test_python_urllib_reaches_an_allowed_name_over_http_and_https(
    make_executor: ExecutorFactory,
    site: UpstreamServer,
    tls_site: UpstreamServer,
    ca_env: dict[str, str],
) -> None:
    ex = make_executor()
    script = (
        "import sys, urllib.request\n"
        "for url in sys.argv[1:]:\n"
        "    print(urllib.request.urlopen(url, timeout=20).read().decode(), end='')\n"
    )
    urls = (site.url("pkg.test", "/hello.txt"), tls_site.url("pkg.test", "/hello.txt"))
    result = await sh(ex, shlex.join([sys.executable, "-c", script, *urls]), env=ca_env)
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text == "hello through the proxy\n" * 2
    assert paths_seen(site) == ["/hello.txt"]
    assert paths_seen(tls_site) == ["/hello.txt"]
    assert facts_denials(result) == ()


# -- refusals -----------------------------------------------------------------------------------


async def test_a_name_off_the_list_gets_403_and_a_proxy_denial(
    make_executor: ExecutorFactory,
    site: UpstreamServer,
    tls_site: UpstreamServer,
    ca_env: dict[str, str],
) -> None:
    ex = make_executor()
    plain = await sh(ex, curl(site.url("evil.test", "/hello.txt"), "--fail-with-body"))
    assert status_and_body(plain) == (
        "403",
        f"bash-sandbox: evil.test:{site.port} is not on the allowlist (allow_domains)\n",
    )
    assert plain.exit_code == 22  # curl's "HTTP error": the run failed
    assert [shape(d) for d in facts_denials(plain)] == [proxy_refusal("evil.test", site.port)]
    assert plain.sandbox is not None and plain.sandbox.network_denied

    tunnelled = await sh(
        ex, curl(tls_site.url("evil.test", "/hello.txt"), "--cacert", ca_env["SSL_CERT_FILE"])
    )
    assert tunnelled.exit_code == 56, tunnelled.stderr.text  # the CONNECT was refused
    assert "403" in tunnelled.stderr.text
    assert [shape(d) for d in facts_denials(tunnelled)] == [
        proxy_refusal("evil.test", tls_site.port)
    ]
    assert tunnelled.sandbox is not None and tunnelled.sandbox.network_denied
    assert site.requests == [] and tls_site.requests == []


async def test_a_name_resolving_to_a_private_address_is_refused_unless_the_rule_names_it(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_executor(allow_domains=(*BASE, "private.test"))
    refused = await sh(ex, curl(site.url("private.test", "/hello.txt"), "--fail-with-body"))
    assert status_and_body(refused)[0] == "403"
    (denial,) = facts_denials(refused)
    assert shape(denial) == proxy_refusal("private.test", site.port)
    assert "resolves to 127.0.0.1" in denial.reason
    assert refused.sandbox is not None and refused.sandbox.network_denied
    assert site.requests == []

    # Rules naming the address, or `localhost` itself, reach it. `--noproxy ''`: the proxy
    # variables send loopback names straight to the sandbox's own loopback otherwise.
    named = with_allowed(ex, f"127.0.0.1:{site.port}", f"localhost:{site.port}")
    for host in ("127.0.0.1", "localhost"):
        result = await sh(ex, curl(site.url(host, "/hello.txt"), "--noproxy", ""), policy=named)
        assert status_and_body(result) == ("200", "hello through the proxy\n"), host
        assert facts_denials(result) == ()
    assert paths_seen(site) == ["/hello.txt", "/hello.txt"]


async def test_an_ip_literal_off_the_list_is_refused(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_executor()
    result = await sh(
        ex, curl(site.url("127.0.0.1", "/hello.txt"), "--noproxy", "", "--fail-with-body")
    )
    status, body = status_and_body(result)
    assert status == "403"
    assert body.startswith(f"bash-sandbox: 127.0.0.1:{site.port} is an IP address not on")
    assert [shape(d) for d in facts_denials(result)] == [proxy_refusal("127.0.0.1", site.port)]
    assert result.sandbox is not None and result.sandbox.network_denied
    assert site.requests == []


async def test_a_client_told_to_ignore_the_proxy_reaches_nothing(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_executor()
    # By name: resolving it means asking the host's resolver, which the supervisor refuses.
    by_name = await sh(ex, curl(site.url("pkg.test", "/hello.txt"), "--noproxy", "*"))
    assert by_name.exit_code != 0
    assert by_name.sandbox is not None and by_name.sandbox.network_denied
    assert {d.evidence for d in facts_denials(by_name)} == {DenialEvidence.SUPERVISOR}
    assert DenialKind.NETWORK_RESOLVE in {d.kind for d in facts_denials(by_name)}
    # By the upstream's own address: 127.0.0.1 here is the sandbox's loopback, not the host's.
    by_address = await sh(ex, curl(site.url("127.0.0.1", "/hello.txt"), "--noproxy", "*"))
    assert by_address.exit_code == CURL_COULD_NOT_CONNECT, by_address.stderr.text
    # Any other address: refused by the supervisor before a packet is made (no route either).
    script = "import socket; socket.create_connection(('192.0.2.1', 80), timeout=5)"
    direct = await sh(ex, shlex.join([sys.executable, "-c", script]))
    assert direct.exit_code != 0
    assert direct.sandbox is not None and direct.sandbox.network_denied
    assert (DenialKind.NETWORK_CONNECT, "192.0.2.1:80", DenialEvidence.SUPERVISOR) in [
        shape(d) for d in facts_denials(direct)
    ]
    assert site.requests == []


# -- per-call policies ---------------------------------------------------------------------------


async def test_a_per_call_policy_with_an_extra_domain_works_for_that_call_only(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_executor()
    url = site.url("other.test", "/hello.txt")
    wider = await sh(ex, curl(url, "--fail-with-body"), policy=with_allowed(ex, "other.test"))
    assert status_and_body(wider) == ("200", "hello through the proxy\n")
    assert paths_seen(site) == ["/hello.txt"]

    after = await sh(ex, curl(url, "--fail-with-body"))
    assert status_and_body(after)[0] == "403"
    assert [shape(d) for d in facts_denials(after)] == [proxy_refusal("other.test", site.port)]
    assert paths_seen(site) == ["/hello.txt"]  # nothing more reached it


async def test_a_client_that_drops_the_token_is_served_only_the_executors_list(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_executor()
    # The same proxy without the userinfo: no Proxy-Authorization, so no grant.
    anonymous = '--proxy "http://${HTTP_PROXY#*@}" --noproxy ""'
    policy = with_allowed(ex, "other.test")
    base = await sh(ex, f"{curl(site.url('pkg.test', '/hello.txt'))} {anonymous}", policy=policy)
    assert status_and_body(base) == ("200", "hello through the proxy\n")
    extra = await sh(
        ex,
        f"{curl(site.url('other.test', '/hello.txt'), '--fail-with-body')} {anonymous}",
        policy=policy,
    )
    assert status_and_body(extra)[0] == "403"
    # A denial without a token is no command's evidence (another could send one into this
    # one's facts): each command registered at the time, this one included, gets a note.
    assert proxy_refusal("other.test", site.port) not in [shape(d) for d in facts_denials(extra)]
    assert extra.sandbox is not None
    assert any("without this sandbox's proxy token" in w for w in extra.sandbox.warnings)
    assert paths_seen(site) == ["/hello.txt"]


@pytest.mark.parametrize("narrower", [(), ("other.test",)])
async def test_a_per_call_list_without_the_executors_entries_is_refused_before_running(
    make_executor: ExecutorFactory,
    site: UpstreamServer,
    workspace: Path,
    narrower: tuple[str, ...],
) -> None:
    ex = make_executor()
    await sh(ex, "true")  # the proxy is up: a narrower command could reach it without a token
    spec = ex.resolve(BashExecRequest(command="true", sandbox_mode="workspace-write"))
    assert spec.sandbox_policy is not None
    fields = {**spec.sandbox_policy.model_dump(), "allow_domains": narrower}
    # What such a command would do: find the proxy's port and use it without a token.
    command = f"touch ran; port=$({shlex.join([sys.executable, '-c', FIND_LISTENER])}); "
    command += curl(site.url("pkg.test", "/hello.txt"), "--noproxy", "")
    command += ' --proxy "http://127.0.0.1:$port"'
    with pytest.raises(SandboxUnavailableError, match=r"lacks the executor's \['pkg.test'\]"):
        await sh(ex, command, policy=SandboxPolicy(**fields))
    assert not (workspace / "ran").exists()
    assert site.requests == []


def test_a_bad_allowlist_entry_in_the_config_is_refused_naming_it(workspace: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"allow_domains entry 'https://pkg.test/x'"):
        SandboxBashExecutor(workspace_root=str(workspace), allow_domains=("https://pkg.test/x",))
    ex = SandboxBashExecutor(workspace_root=str(workspace), allow_domains=("PKG.Test.",))
    assert ex.config.allow_domains == ("pkg.test",)


# -- real tools --------------------------------------------------------------------------------


async def test_pip_download_from_an_allowed_https_index(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    ca: ThrowawayCA,
    ca_env: dict[str, str],
) -> None:
    root = tmp_path / "index"
    wheel = make_simple_index(root)
    ex = make_executor()
    with UpstreamServer(root, tls=ca.server_context(TEST_NAMES)) as index:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input"]
        argv += ["--disable-pip-version-check", "-d", str(workspace / "dest")]
        argv += ["--index-url", index.url("files.pkg.test", "/simple/"), "egress-probe"]
        env = {**ca_env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}
        policy = with_allowed(ex, "files.pkg.test", mode="workspace-write")
        result = await sh(ex, shlex.join(argv), env=env, policy=policy)
        assert result.exit_code == 0, result.stdout.text + result.stderr.text
    served = (root / "simple" / "egress-probe" / wheel).read_bytes()
    fetched = (workspace / "dest" / wheel).read_bytes()
    assert hashlib.sha256(fetched).digest() == hashlib.sha256(served).digest()
    assert "/simple/egress-probe/" in paths_seen(index)
    assert facts_denials(result) == ()


def npm_view(registry: str, workspace: Path) -> tuple[str, dict[str, str]]:
    """`npm view egress-probe version` against ``registry``, no npm config of the host."""
    command = shlex.join(["npm", "view", "egress-probe", "version", "--registry", registry])
    env = {
        "npm_config_userconfig": str(workspace / "no-user-npmrc"),
        "npm_config_globalconfig": str(workspace / "no-global-npmrc"),
        "npm_config_update_notifier": "false",
        "npm_config_fetch_retries": "0",  # a refused CONNECT is not worth a retry
        "npm_config_audit": "false",
    }
    return command, env


async def test_npm_view_against_an_allowed_registry_and_a_refused_one(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    ca: ThrowawayCA,
    ca_env: dict[str, str],
) -> None:
    ex = make_executor()
    policy = with_allowed(ex, "registry.test")
    with UpstreamServer(tmp_path, tls=ca.server_context(TEST_NAMES)) as registry:
        tarball = registry.url("registry.test", "/egress-probe/-/egress-probe-1.2.3.tgz")
        registry.route("/egress-probe", npm_packument("egress-probe", "1.2.3", tarball))
        command, env = npm_view(registry.url("registry.test", "/"), workspace)
        allowed = await sh(ex, command, env={**ca_env, **env}, policy=policy)
        assert allowed.exit_code == 0, allowed.stdout.text + allowed.stderr.text
        assert allowed.stdout.text.strip() == "1.2.3"
        assert paths_seen(registry) == ["/egress-probe"]
        assert facts_denials(allowed) == ()

        command, env = npm_view(registry.url("evil.test", "/"), workspace)
        refused = await sh(ex, command, env={**ca_env, **env}, policy=policy)
        assert refused.exit_code != 0
        assert [shape(d) for d in facts_denials(refused)] == [
            proxy_refusal("evil.test", registry.port)
        ]
        assert refused.sandbox is not None and refused.sandbox.network_denied
        assert paths_seen(registry) == ["/egress-probe"]


async def test_git_ls_remote_over_dumb_http(make_executor: ExecutorFactory, tmp_path: Path) -> None:
    root = tmp_path / "git"
    root.mkdir()
    head = make_dumb_git_repo(root)
    ex = make_executor()
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
    with UpstreamServer(root) as server:
        command = shlex.join(["git", "ls-remote", server.url("git.test", "/probe.git")])
        result = await sh(ex, command, env=env, policy=with_allowed(ex, "git.test"))
        assert result.exit_code == 0, result.stderr.text
        assert f"{head}\tHEAD" in result.stdout.text
        assert any(path.startswith("/probe.git/info/refs") for path in paths_seen(server))
        assert facts_denials(result) == ()


# -- where the proxy is reachable ----------------------------------------------------------------


async def proxy_url_of(ex: SandboxBashExecutor) -> tuple[str, int]:
    """The proxy URL one command of ``ex`` is given, and its port."""
    result = await sh(ex, 'printf %s "$HTTP_PROXY"')
    url = result.stdout.text
    match = re.fullmatch(r"http://bsx-[0-9a-f]+:x@127\.0\.0\.1:(\d+)", url)
    assert match is not None, url
    return url, int(match.group(1))


def through(proxy: str, url: str) -> str:
    """curl ``url`` through the proxy at ``proxy``, whatever the environment says."""
    return curl(url, "--proxy", proxy, "--noproxy", "")


async def test_the_proxy_is_reachable_only_from_its_own_executors_commands(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_executor()
    other = make_executor(allow_domains=("other.test",))
    proxy, _ = await proxy_url_of(ex)
    target = site.url("pkg.test", "/hello.txt")

    # The positive control: from a command of its own executor the URL works.
    own = await sh(ex, through(proxy, target))
    assert status_and_body(own) == ("200", "hello through the proxy\n")
    assert paths_seen(site) == ["/hello.txt"]

    # The host's namespace: nothing listens at that port on the host's loopback.
    host = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "--proxy", proxy, "--noproxy", "", target],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert host.returncode == CURL_COULD_NOT_CONNECT, host.stderr
    # Another executor's command: its namespace is another one, with its own loopback.
    neighbour = await sh(other, through(proxy, target))
    assert neighbour.exit_code == CURL_COULD_NOT_CONNECT, neighbour.stderr.text
    assert paths_seen(site) == ["/hello.txt"]  # only the control reached the upstream


def hold_one_connection(listener: socket.socket, closed: threading.Event) -> None:
    """Accept one connection, read until the peer closes it, then set ``closed``."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(30)
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass
            closed.set()


async def test_a_timed_out_commands_tunnel_is_closed_upstream(
    make_executor: ExecutorFactory,
) -> None:
    ex = make_executor()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        closed = threading.Event()
        holder = threading.Thread(target=hold_one_connection, args=(listener, closed))
        holder.start()
        # A CONNECT tunnel to an upstream that never answers, then the command hangs.
        command = f"curl -sS -p http://pkg.test:{port}/ & sleep 60"
        request = BashExecRequest(command=command, timeout_ms=1_500)
        result = await ex.run(ex.resolve(request))
        assert result.timed_out
        holder.join(30)
        assert closed.is_set()  # the upstream saw the tunnel end


# -- nothing left after aclose() ----------------------------------------------------------------


def fd_links() -> set[str]:
    links = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            links.add(os.readlink(f"/proc/self/fd/{name}"))
    return links


def listener_inode(proc_net_tcp: str, port: int) -> str:
    """The inode of the socket listening on 127.0.0.1:``port`` in a /proc/net/tcp dump."""
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return fields[9]
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}:\n{proc_net_tcp}")


def processes_in(netns: str, *, started_before_s: float) -> list[int]:
    """Processes in the network namespace ``netns`` (``net:[N]``) that already existed at
    ``started_before_s`` (CLOCK_BOOTTIME): a namespace made later may reuse the number."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/net") != netns:
                continue
            with open(f"/proc/{pid}/stat") as f:
                started = int(f.read().rpartition(")")[2].split()[19]) / ticks
            if started < started_before_s:
                found.append(int(pid))
    return found


async def namespace_and_listener(
    ex: SandboxBashExecutor, site: UpstreamServer
) -> tuple[str, str, str]:
    """``ex``'s network namespace (``net:[N]``), its proxy's listening socket (``socket:[N]``)
    and a proxy URL, as commands see them, after one request through the proxy."""
    probe = await sh(
        ex,
        "readlink /proc/self/ns/net; cat /proc/net/tcp; "
        + curl(site.url("pkg.test", "/hello.txt")),
    )
    netns, _, rest = probe.stdout.text.partition("\n")
    assert re.fullmatch(r"net:\[\d+\]", netns), probe.stdout.text
    assert rest.endswith("\n200")  # the proxy served a connection
    proxy, port = await proxy_url_of(ex)
    return netns, f"socket:[{listener_inode(rest, port)}]", proxy


def threads_started_since(before: set[threading.Thread]) -> list[str]:
    """Names of live threads not in ``before``, but the test loop's default executor's
    workers (asyncio.to_thread) and the upstream test server's per-connection threads
    (socketserver's, which finish on their own time)."""
    return [
        t.name
        for t in threading.enumerate()
        if t not in before
        and not t.name.startswith("asyncio_")
        and "process_request_thread" not in t.name
    ]


async def test_aclose_leaves_no_proxy_thread_listening_socket_or_namespace(
    make_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    threads_before = set(threading.enumerate())
    ex = make_executor()
    netns, socket_link, proxy = await namespace_and_listener(ex, site)
    # Positive controls: while the executor lives, this process holds both, and a background
    # command of it sits in the namespace.
    assert {netns, socket_link} <= fd_links()
    await ex.start(ex.resolve(BashExecRequest(command="exec sleep 60")))
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert processes_in(netns, started_before_s=now + 1) != []

    await ex.aclose()
    closed_at = time.clock_gettime(time.CLOCK_BOOTTIME)

    assert netns not in fd_links()
    assert socket_link not in fd_links()
    assert processes_in(netns, started_before_s=closed_at) == []
    assert threads_started_since(threads_before) == []

    fresh = make_executor()
    after = await sh(fresh, through(proxy, site.url("pkg.test", "/hello.txt")))
    assert after.exit_code == CURL_COULD_NOT_CONNECT, after.stderr.text
    assert paths_seen(site) == ["/hello.txt"]  # only the request made before aclose()


async def test_an_executor_dropped_without_aclose_stops_its_proxy(
    backend: str, workspace: Path, site: UpstreamServer
) -> None:
    threads_before = set(threading.enumerate())
    ex = SandboxBashExecutor(
        backend=backend, workspace_root=str(workspace), allow_domains=BASE, egress_resolver=RESOLVER
    )
    netns, socket_link, _ = await namespace_and_listener(ex, site)
    assert {netns, socket_link} <= fd_links()
    assert "bash-sandbox-egress" in threads_started_since(threads_before)

    del ex
    gc.collect()  # the executor's finalizer runs once it is collected

    assert netns not in fd_links()
    assert socket_link not in fd_links()
    assert threads_started_since(threads_before) == []
