"""Credentials that never enter the sandbox: the proxy injects them on their own domain only.

A real TLS upstream on the host's 127.0.0.1 (a throwaway CA the *proxy* is told to trust)
serves `registry.test` and `git.test`, pinned by a temp hosts file. The executor holds two
secrets, read from its own environment; sandboxed curl and git see placeholders. Judged
from outside: the headers the upstream received, the result's denials, and what the
command's environment and files held.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_sandbox.egress.credentials import PLACEHOLDER_PREFIX
from bash_seam import BashExecRequest, BashRunResult
from policies.egress import EgressCredential
from tests.egress.conftest import ExecutorFactory
from tests.egress.servers import ThrowawayCA, UpstreamServer

SECRET = "ghp_real-secret-1234567890"
GIT_SECRET = "glpat-other-secret-0987"


@pytest.fixture
def upstream(site_root: Path, ca: ThrowawayCA) -> Iterator[UpstreamServer]:
    with UpstreamServer(site_root, tls=ca.server_context(["registry.test", "git.test"])) as s:
        yield s


@pytest.fixture
def executor_kw(
    tmp_path: Path, ca: ThrowawayCA, monkeypatch: pytest.MonkeyPatch
) -> dict[str, object]:
    monkeypatch.setenv("BSX_TEST_SECRET", SECRET)
    hosts = tmp_path / "cred-hosts"
    hosts.write_text("127.0.0.1 registry.test git.test other.test\n")
    secret_file = tmp_path / "git-secret"
    secret_file.write_text(GIT_SECRET + "\n")
    return {
        "hosts_file": str(hosts),
        "allow_domains": ("registry.test", "git.test", "other.test"),
        "credentials": (
            EgressCredential(
                domain="registry.test",
                source="env:BSX_TEST_SECRET",
                env="TOKEN",
                username="x-access-token",
                upstream_ca_file=str(ca.ca_file),
            ),
            EgressCredential(
                domain="git.test",
                source=f"file:{secret_file}",
                env="GIT_TOKEN",
                upstream_ca_file=str(ca.ca_file),
            ),
        ),
    }


async def sh(ex: object, command: str) -> BashRunResult:
    from bash_sandbox import SandboxBashExecutor

    assert isinstance(ex, SandboxBashExecutor)
    return await ex.run(ex.resolve(BashExecRequest(command=command, timeout_ms=60_000)))


def curl(url: str, *args: str) -> str:
    return " ".join(
        ["curl", "-sS", "--max-time", "20", "-w", r"'\n%{http_code}'", *args, shlex.quote(url)]
    )


async def test_a_bearer_token_is_injected_on_its_domain_and_never_seen_inside(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    executor_kw: dict[str, object],
) -> None:
    ex = make_pinned_executor(**executor_kw)
    url = upstream.url("registry.test", "/hello.txt")
    result = await sh(ex, curl(url, "-H", '"Authorization: Bearer $TOKEN"'))
    assert result.stdout.text == "hello through the proxy\n\n200", result.stderr.text
    assert [r.headers.get("authorization") for r in upstream.requests] == [f"Bearer {SECRET}"]
    # Inside: the placeholder, never the secret (environment, private /tmp, workspace).
    probe = await sh(ex, 'printf "%s\\n" "$TOKEN"')
    assert probe.stdout.text.startswith(PLACEHOLDER_PREFIX)
    scan = await sh(
        ex, f"env | grep -c {SECRET[:12]} ; grep -rl {SECRET[:12]} /tmp . 2>/dev/null; true"
    )
    assert scan.stdout.text.strip() == "0", scan.stdout.text


async def test_an_upstream_the_proxy_cannot_verify_never_gets_the_secret(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    executor_kw: dict[str, object],
) -> None:
    unverified = tuple(
        c.model_copy(update={"upstream_ca_file": None})
        for c in executor_kw["credentials"]  # type: ignore[attr-defined]
    )
    ex = make_pinned_executor(**(executor_kw | {"credentials": unverified}))
    url = upstream.url("registry.test", "/hello.txt")
    result = await sh(ex, curl(url, "-H", '"Authorization: Bearer $TOKEN"'))
    assert result.exit_code != 0
    assert upstream.requests == []  # the handshake failed: no request, no secret


async def test_basic_auth_and_the_git_credential_helper_get_the_placeholder_only(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    executor_kw: dict[str, object],
) -> None:
    ex = make_pinned_executor(**executor_kw)
    url = upstream.url("registry.test", "/hello.txt")
    result = await sh(ex, curl(url, "-u", '"x-access-token:$TOKEN"'))
    assert result.stdout.text.endswith("\n200"), result.stderr.text
    expected = base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()
    assert upstream.requests[-1].headers.get("authorization") == f"Basic {expected}"
    helper = await sh(
        ex, "printf 'protocol=https\\nhost=registry.test\\n\\n' | git credential fill"
    )
    assert "username=x-access-token" in helper.stdout.text, helper.stderr.text
    assert f"password={PLACEHOLDER_PREFIX}" in helper.stdout.text
    assert SECRET not in helper.stdout.text


async def test_a_placeholder_sent_to_another_domain_is_refused_and_reported(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    site: UpstreamServer,
    executor_kw: dict[str, object],
) -> None:
    ex = make_pinned_executor(**executor_kw)
    # Over TLS to the other credential's domain: terminated there, so seen and refused.
    wrong = await sh(
        ex, curl(upstream.url("git.test", "/hello.txt"), "-H", '"Authorization: Bearer $TOKEN"')
    )
    assert wrong.stdout.text.endswith("\n403"), wrong.stderr.text
    assert "credential for registry.test" in wrong.stdout.text
    assert upstream.requests == []
    assert wrong.sandbox is not None
    assert [d.target for d in wrong.sandbox.denials] == [f"git.test:{upstream.port}"]
    # Over plain HTTP, to a domain without credential: refused before anything is sent.
    plain = await sh(
        ex, curl(site.url("other.test", "/hello.txt"), "-H", '"Authorization: Bearer $TOKEN"')
    )
    assert plain.stdout.text.endswith("\n403"), plain.stderr.text
    assert site.requests == []
    # git.test's own credential, from a file, is injected there.
    right = await sh(
        ex,
        curl(upstream.url("git.test", "/hello.txt"), "-H", '"Authorization: token $GIT_TOKEN"'),
    )
    assert right.stdout.text.endswith("\n200"), right.stderr.text
    assert upstream.requests[-1].headers.get("authorization") == f"token {GIT_SECRET}"


async def test_a_credential_file_is_never_readable_by_a_command(
    make_pinned_executor: ExecutorFactory, executor_kw: dict[str, object], tmp_path: Path
) -> None:
    ex = make_pinned_executor(**executor_kw)
    result = await sh(ex, f"cat {shlex.quote(str(tmp_path / 'git-secret'))}")
    assert result.exit_code != 0
    assert GIT_SECRET not in result.stdout.text + result.stderr.text


class _SmartGit(http.server.BaseHTTPRequestHandler):
    """`git http-backend` behind Basic auth that only the real secret passes."""

    root = ""
    expected = ""
    seen: list[str] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _serve(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.seen.append(auth)
        if auth != self.expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REMOTE_USER": "x-access-token",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": self.root,
        }
        backend = ["git", "http-backend"]
        run = subprocess.run(
            backend, input=body, env=env, capture_output=True, timeout=60, check=True
        )
        out = run.stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.split(b"\r\n"):
            name, _, value = line.decode().partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _serve
    do_POST = _serve


async def test_git_push_over_https_with_basic_auth_gets_the_secret_only_on_the_wire(
    make_pinned_executor: ExecutorFactory,
    executor_kw: dict[str, object],
    ca: ThrowawayCA,
    tmp_path: Path,
) -> None:
    root = tmp_path / "git-root"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", str(root / "repo.git")], check=True)
    token = base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()
    handler = type("Handler", (_SmartGit,), {"root": str(root), "expected": f"Basic {token}"})
    handler.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = ca.server_context(["registry.test"]).wrap_socket(
        server.socket, server_side=True
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ex = make_pinned_executor(**executor_kw, mode="workspace-write")
        url = f"https://registry.test:{server.server_address[1]}/repo.git"
        script = (
            "set -e; export GIT_TERMINAL_PROMPT=0 GIT_CONFIG_GLOBAL=/dev/null; "
            "git init -q src && cd src && echo pushed > f && git add f && "
            "git -c user.name=t -c user.email=t@t commit -qm pushed && "
            f"git push -q {shlex.quote(url)} HEAD:refs/heads/main"
        )
        result = await sh(ex, script)
        assert result.exit_code == 0, result.stderr.text
    finally:
        server.shutdown()
        server.server_close()
    log = subprocess.run(
        ["git", "--git-dir", str(root / "repo.git"), "log", "--format=%s", "main"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert log.stdout == "pushed\n"
    assert f"Basic {token}" in handler.seen
    assert all(
        PLACEHOLDER_PREFIX not in base64.b64decode(a[6:] or b"").decode() for a in handler.seen if a
    )


class _ReflectingApi(http.server.BaseHTTPRequestHandler):
    """An API as many are: CORS reflects the request's Origin, a redirect its Host, an error
    page its User-Agent. Only Authorization is what it checks."""

    seen: list[dict[str, str]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = f"hello {self.headers.get('User-Agent', '')}\n".encode()
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin", "*"))
        self.send_header("Location", f"https://{self.headers.get('Host', '')}/next")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


async def test_the_secret_goes_only_into_credential_headers_never_ones_an_upstream_echoes(
    make_pinned_executor: ExecutorFactory, executor_kw: dict[str, object], ca: ThrowawayCA
) -> None:
    # The placeholder in Origin, Host or User-Agent came back as the secret in the
    # response headers and body (CORS reflection, redirects): the sandbox read it.
    handler = type("Handler", (_ReflectingApi,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = ca.server_context(["registry.test"]).wrap_socket(
        server.socket, server_side=True
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ex = make_pinned_executor(**executor_kw)
        url = f"https://registry.test:{server.server_address[1]}/api"
        echoed = curl(
            url,
            "-i",
            "-H",
            '"Authorization: Bearer $TOKEN"',
            "-H",
            '"Origin: https://$TOKEN"',
            "-H",
            '"User-Agent: $TOKEN"',
        )
        host = curl(url, "-i", "-H", '"Host: $TOKEN"')
        result = await sh(ex, f"{echoed}; echo; {host}")
    finally:
        server.shutdown()
        server.server_close()
    seen = handler.seen
    # A `Host` other than the domain is refused before anything is sent (a shared front
    # routes by it: `test_a_request_addressed_past_the_credentials_domain_is_refused`).
    assert len(seen) == 1, result.stdout.text + result.stderr.text
    assert result.stdout.text.rstrip().endswith("403")
    assert seen[0]["authorization"] == f"Bearer {SECRET}"  # still injected where it belongs
    assert SECRET not in result.stdout.text + result.stderr.text
    for headers in seen:
        for name in ("origin", "user-agent", "host"):
            assert SECRET not in headers.get(name, ""), (name, headers)


async def test_an_upstream_ca_file_commands_could_write_is_refused(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    executor_kw: dict[str, object],
    tmp_path: Path,
    ca: ThrowawayCA,
) -> None:
    # A bundle in the workspace: a command could add its own CA and have the proxy send the
    # secret to a server of its own. Refused before anything runs.
    from bash_sandbox import SandboxUnavailableError
    from bash_seam import BashExecRequest

    planted = tmp_path / "ws" / "ca.pem"
    planted.write_bytes(Path(ca.ca_file).read_bytes())
    in_workspace = tuple(
        c.model_copy(update={"upstream_ca_file": str(planted)})
        for c in executor_kw["credentials"]  # type: ignore[attr-defined]
    )
    ex = make_pinned_executor(
        **(executor_kw | {"credentials": in_workspace, "mode": "workspace-write"})
    )
    marker = tmp_path / "ws" / "ran"
    with pytest.raises(SandboxUnavailableError, match=r"upstream_ca_file .* lies in the writable"):
        await ex.run(ex.resolve(BashExecRequest(command=f"touch {marker}")))
    assert not marker.exists()
    assert upstream.requests == []


@pytest.mark.parametrize(
    "shape",
    [
        '-H "Host: evil.test"',  # a shared front routes by Host to another tenant
        "--request-target http://evil.test/b",  # or by an absolute target
        "-X TRACE",  # an upstream that echoes the request hands the secret back
        "--request-target //evil.test/x",  # a front that joins it as a URL
    ],
    ids=["host", "absolute-target", "trace", "scheme-relative"],
)
async def test_a_request_addressed_past_the_credentials_domain_is_refused(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    executor_kw: dict[str, object],
    shape: str,
) -> None:
    # The certificate proves who terminates TLS, not who the request is for: a red team's
    # front relayed `Host: evil.test` (and `http://evil.test/b`) with the injected secret.
    ex = make_pinned_executor(**executor_kw)
    url = upstream.url("registry.test", "/hello.txt")
    result = await sh(ex, curl(url, "-H", '"Authorization: Bearer $TOKEN"', shape))
    assert result.stdout.text.endswith("\n403"), result.stdout.text + result.stderr.text
    assert upstream.requests == []  # nothing was sent: no secret anywhere
    assert SECRET not in result.stdout.text + result.stderr.text
    assert result.sandbox is not None
    assert [d.target for d in result.sandbox.denials] == [f"registry.test:{upstream.port}"]
    # The domain's own paths still get the secret, without routing hints a front may follow.
    right = await sh(
        ex,
        curl(url, "-H", '"Authorization: Bearer $TOKEN"', "-H", '"X-Forwarded-Host: evil.test"'),
    )
    assert right.stdout.text.endswith("\n200"), right.stderr.text
    assert "x-forwarded-host" not in upstream.requests[-1].headers


async def test_a_request_framed_two_ways_reaches_the_upstream_framed_one_way(
    make_pinned_executor: ExecutorFactory,
    upstream: UpstreamServer,
    executor_kw: dict[str, object],
) -> None:
    # Content-Length beside Transfer-Encoding: an upstream reading the length would take
    # the chunked rest as a new request on the kept connection, one the proxy never saw,
    # with the next request's injected secret in its body (red team). The length goes.
    ex = make_pinned_executor(**executor_kw)
    url = upstream.url("registry.test", "/upload")
    result = await sh(
        ex,
        curl(
            url,
            "-H", '"Authorization: Bearer $TOKEN"',
            "-H", '"Transfer-Encoding: chunked"',
            "-H", '"Content-Length: 3"',
            "--data-binary", "hello-body",
        ),
    )  # fmt: skip
    assert result.stdout.text.endswith("\n200"), result.stdout.text + result.stderr.text
    [seen] = upstream.requests
    assert seen.method == "POST" and "content-length" not in seen.headers, seen.headers
    assert seen.headers.get("transfer-encoding") == "chunked"
    assert hashlib.sha256(b"hello-body").hexdigest() in result.stdout.text  # the whole body


@pytest.mark.parametrize("name", ["HOME", "LANG", "LC_GHPAT"])
def test_a_secret_in_a_variable_every_command_inherits_is_refused(name: str) -> None:
    # `LC_*` names pass into every command (locale settings, and tokens forwarded over ssh
    # as `LC_*`): a secret read from one was printed by `env` inside (red team).
    from bash_sandbox.egress.credentials import CredentialError, CredentialVault

    spec = EgressCredential(domain="registry.test", source=f"env:{name}", env="TOKEN")
    with pytest.raises(CredentialError, match="passed to every command"):
        CredentialVault((spec,), environ={name: "ghp_LC_REALSECRET_777"})
