"""The egress proxy against real clients (curl, urllib, http.client) and real upstreams.

The upstreams listen on the host's 127.0.0.1 and are reached through test names that the
proxy's resolver maps there. Every refusal is checked from outside: the upstream saw no
request, and the denial landed on the right grant.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bash_sandbox.egress import EgressDenialCode, StaticResolver
from bash_sandbox.egress import tunnel as tunnel_module
from tests.egress.conftest import ProxyFactory, curl, status_and_body
from tests.egress.servers import ThrowawayCA, UpstreamServer

HELLO = "hello through the proxy"


def test_allowed_name_over_plain_http_reaches_upstream_without_the_token(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    status, body = status_and_body(curl(site.url("pkg.test", "/hello.txt"), grant.environment()))
    assert (status, body.strip()) == ("200", HELLO)
    (seen,) = site.requests
    assert seen.path == "/hello.txt"  # origin-form upstream, not the absolute URL
    assert seen.headers["host"] == f"pkg.test:{site.port}"
    assert "proxy-authorization" not in seen.headers
    assert grant.denials() == []


def test_allowed_name_over_https_goes_through_a_connect_tunnel(
    make_proxy: ProxyFactory, tls_site: UpstreamServer, ca: ThrowawayCA
) -> None:
    proxy = make_proxy()
    grant = proxy.register(("*.pkg.test",))
    result = curl(
        tls_site.url("files.pkg.test", "/hello.txt"), grant.environment(), "-v", ca_file=ca.ca_file
    )
    status, body = status_and_body(result)
    assert (status, body.strip()) == ("200", HELLO), result.stderr
    assert "CONNECT files.pkg.test:" in result.stderr
    assert [r.path for r in tls_site.requests] == ["/hello.txt"]


def test_python_urllib_follows_the_proxy_variables(
    make_proxy: ProxyFactory, site: UpstreamServer, tls_site: UpstreamServer, ca: ThrowawayCA
) -> None:
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    script = (
        "import ssl, sys, urllib.request\n"
        "ctx = ssl.create_default_context(cafile=sys.argv[3])\n"
        "for url in sys.argv[1:3]:\n"
        "    print(urllib.request.urlopen(url, context=ctx, timeout=20).read().decode().strip())\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            site.url("pkg.test", "/hello.txt"),
            tls_site.url("pkg.test", "/hello.txt"),
            str(ca.ca_file),
        ],
        check=False,
        env={**os.environ, **grant.environment()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.splitlines() == [HELLO, HELLO], out.stderr
    assert len(site.requests) == 1 and len(tls_site.requests) == 1


def test_a_name_off_the_list_gets_403_a_readable_reason_and_a_denial(
    make_proxy: ProxyFactory, site: UpstreamServer, tls_site: UpstreamServer, ca: ThrowawayCA
) -> None:
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    status, body = status_and_body(curl(site.url("evil.test", "/x"), grant.environment()))
    assert status == "403"
    assert (
        body.strip()
        == f"bash-sandbox: evil.test:{site.port} is not on the allowlist (allow_domains)"
    )
    tunnelled = curl(tls_site.url("evil.test", "/x"), grant.environment(), "-v", ca_file=ca.ca_file)
    assert (
        f"403 bash-sandbox: evil.test:{tls_site.port} is not on the allowlist" in tunnelled.stderr
    )
    assert site.requests == [] and tls_site.requests == []
    assert [(d.host, d.port, d.code) for d in grant.denials()] == [
        ("evil.test", site.port, EgressDenialCode.NOT_ALLOWED),
        ("evil.test", tls_site.port, EgressDenialCode.NOT_ALLOWED),
    ]
    assert grant.denials()[0].marker() == (
        f"[sandbox: network connect to evil.test:{site.port} denied (not on the allowlist) "
        "under isolated network; add it to allow_domains or ask for network=host]"
    )


def test_an_ip_literal_is_refused_unless_a_rule_names_it(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy()
    literal = f"http://127.0.0.1:{site.port}/hello.txt"
    refused = proxy.register(("pkg.test",))
    status, _ = status_and_body(curl(literal, refused.environment(), "--noproxy", ""))
    assert status == "403"
    assert site.requests == []
    assert refused.denials()[0].code is EgressDenialCode.ADDRESS_NOT_ALLOWED
    named = proxy.register((f"127.0.0.1:{site.port}",))
    status, body = status_and_body(curl(literal, named.environment(), "--noproxy", ""))
    assert (status, body.strip()) == ("200", HELLO)
    assert len(site.requests) == 1


def test_a_name_resolving_to_loopback_is_refused_unless_pinned_or_localhost(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    dns_like = StaticResolver({"rebind.test": "127.0.0.1"}, pinned=False)
    proxy = make_proxy(resolver=dns_like)
    grant = proxy.register(("rebind.test", f"localhost:{site.port}"))
    status, body = status_and_body(curl(site.url("rebind.test", "/hello.txt"), grant.environment()))
    assert status == "403"
    assert "resolves to 127.0.0.1 (loopback)" in body
    assert site.requests == []
    assert grant.denials()[0].code is EgressDenialCode.FORBIDDEN_ADDRESS
    # A rule naming localhost asks for loopback: the host's, through the proxy.
    status, body = status_and_body(
        curl(site.url("localhost", "/hello.txt"), grant.environment(), "--noproxy", "")
    )
    assert (status, body.strip()) == ("200", HELLO)
    assert len(site.requests) == 1
    status, _ = status_and_body(
        curl(f"http://localhost:{site.port + 1}/", grant.environment(), "--noproxy", "")
    )
    assert status == "403"  # another port of localhost is not named


def test_tokens_attribute_denials_to_their_own_grant(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy(allow=("pkg.test",))
    first = proxy.register(("pkg.test", "other.test"))
    second = proxy.register(("pkg.test",))
    assert first.token != second.token
    assert (
        status_and_body(curl(site.url("other.test", "/hello.txt"), first.environment()))[0] == "200"
    )
    assert (
        status_and_body(curl(site.url("other.test", "/hello.txt"), second.environment()))[0]
        == "403"
    )
    assert first.denials() == []
    assert [d.host for d in second.denials()] == ["other.test"]
    # No token: the base list. Its denial is no grant's (any command of the executor could
    # have sent it into another's facts: a red team forged `network_denied` that way); each
    # open grant gets a note that says so.
    anonymous = proxy.environment()
    assert status_and_body(curl(site.url("pkg.test", "/hello.txt"), anonymous))[0] == "200"
    assert status_and_body(curl(site.url("other.test", "/hello.txt"), anonymous))[0] == "403"
    assert first.denials() == []
    assert [d.host for d in second.denials()] == ["other.test"]
    assert any("without this sandbox's proxy token" in n for n in first.notes())
    # A forged token is no token.
    forged = {k: v.replace(first.token, "0" * 32) for k, v in first.environment().items()}
    assert status_and_body(curl(site.url("other.test", "/hello.txt"), forged))[0] == "403"
    assert first.denials() == []
    assert [r.headers["host"].split(":")[0] for r in site.requests] == ["other.test", "pkg.test"]


def _connect_tunnel(proxy_port: int, target: str, token: str | None) -> socket.socket:
    import base64

    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    auth = ""
    if token is not None:
        basic = base64.b64encode(f"bsx-{token}:x".encode()).decode()
        auth = f"Proxy-Authorization: Basic {basic}\r\n"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def test_closing_a_grant_closes_its_tunnels_and_revokes_its_token(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    other = proxy.register(("pkg.test",))
    port = proxy.address[1]
    mine = _connect_tunnel(port, f"pkg.test:{site.port}", grant.token)
    theirs = _connect_tunnel(port, f"pkg.test:{site.port}", other.token)
    grant.close()
    grant.close()  # idempotent
    assert mine.recv(1) == b""  # the proxy closed it (the 10 s socket timeout would raise)
    theirs.sendall(b"GET /hello.txt HTTP/1.1\r\nHost: pkg.test\r\nConnection: close\r\n\r\n")
    reply = b""
    while chunk := theirs.recv(65536):
        reply += chunk
    assert HELLO.encode() in reply
    mine.close()
    theirs.close()
    # The revoked token is served as anonymous: the (empty) base list refuses.
    assert (
        status_and_body(curl(site.url("pkg.test", "/hello.txt"), grant.environment()))[0] == "403"
    )
    # Not the other grant's denial: a note that a request without a token was refused.
    assert other.denials() == []
    assert any("pkg.test" in n for n in other.notes())


def test_a_kept_alive_client_connection_serves_several_requests(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy(allow=("pkg.test", "other.test"))
    conn = http.client.HTTPConnection(*proxy.address, timeout=10)
    hosts = ["pkg.test", "other.test"] * 10
    for host in hosts:
        conn.request("GET", site.url(host, "/hello.txt"))
        response = conn.getresponse()
        assert (response.status, response.read().decode().strip()) == (200, HELLO)
    conn.close()
    assert len(site.requests) == len(hosts)


def test_request_bodies_are_forwarded_with_either_framing(
    make_proxy: ProxyFactory, site: UpstreamServer, tmp_path: Path
) -> None:
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    payload = os.urandom(3 * 1024 * 1024)
    upload = tmp_path / "payload.bin"
    upload.write_bytes(payload)
    expected = hashlib.sha256(payload).hexdigest()
    sized = curl(
        site.url("pkg.test", "/upload"), grant.environment(), "--data-binary", f"@{upload}"
    )
    assert status_and_body(sized) == ("200", expected)
    chunked = curl(
        site.url("pkg.test", "/upload"),
        grant.environment(),
        "--data-binary",
        f"@{upload}",
        "-H",
        "Transfer-Encoding: chunked",
    )
    assert status_and_body(chunked) == ("200", expected)
    assert [r.method for r in site.requests] == ["POST", "POST"]
    assert site.requests[1].headers.get("transfer-encoding") == "chunked"


def test_unreachable_and_unresolvable_destinations_get_502_not_a_denial(
    make_proxy: ProxyFactory,
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    proxy = make_proxy()
    grant = proxy.register(("pkg.test", "nowhere.test"))
    status, body = status_and_body(curl(f"http://pkg.test:{dead_port}/", grant.environment()))
    assert status == "502" and "cannot connect" in body
    status, body = status_and_body(curl("http://nowhere.test/", grant.environment()))
    assert status == "502" and "cannot resolve nowhere.test" in body
    assert grant.denials() == []


def test_the_copying_tunnel_works_where_splice_is_missing(
    make_proxy: ProxyFactory,
    tls_site: UpstreamServer,
    ca: ThrowawayCA,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tunnel_module, "_SPLICE", None)
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    status, body = status_and_body(
        curl(tls_site.url("pkg.test", "/hello.txt"), grant.environment(), ca_file=ca.ca_file)
    )
    assert (status, body.strip()) == ("200", HELLO)


def test_a_large_download_through_the_tunnel_is_intact(
    make_proxy: ProxyFactory,
    site_root: Path,
    tls_site: UpstreamServer,
    ca: ThrowawayCA,
    tmp_path: Path,
) -> None:
    blob = os.urandom(1 << 20) * 24
    (site_root / "blob.bin").write_bytes(blob)
    proxy = make_proxy()
    grant = proxy.register(("pkg.test",))
    out = tmp_path / "downloaded"
    result = curl(
        tls_site.url("pkg.test", "/blob.bin"),
        grant.environment(),
        "-o",
        str(out),
        ca_file=ca.ca_file,
    )
    assert result.stdout.strip() == "200", result.stderr
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(blob).digest()


def test_register_validates_the_allowlist(make_proxy: ProxyFactory) -> None:
    from policies.egress import EgressRuleError

    proxy = make_proxy()
    with pytest.raises(EgressRuleError):
        proxy.register(("http://pkg.test/",))


_OWN_ADDRESS_DRIVER = r"""
import http.server, json, os, socket, subprocess, sys, threading
from bash_sandbox.egress import EgressProxy, StaticResolver

# This network namespace is the test's own: 10.200.0.1 is an address of "the host" here.
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "10.200.0.1/32", "dev", "lo"], check=True)
hits = []

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "12")
        self.end_headers()
        self.wfile.write(b"HOST-SECRET\n")

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("10.200.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
listen = socket.socket()
listen.bind(("127.0.0.1", 0))
listen.listen()
dns = StaticResolver({"mirror.corp.test": "10.200.0.1", "pkg.test": "10.200.0.1"}, pinned=False)
proxy = EgressProxy(
    listen, allow=("mirror.corp.test", "pkg.test"), resolver=dns,
    allow_private=("mirror.corp.test",),
)
proxy.start()
grant = proxy.register(("mirror.corp.test", "pkg.test"))
out = {}
for name in ("mirror.corp.test", "pkg.test"):
    run = subprocess.run(
        ["curl", "-sS", "--max-time", "10", f"http://{name}:{server.server_address[1]}/x"],
        env=dict(os.environ, **grant.environment()), capture_output=True, text=True,
    )
    out[name] = run.stdout
out["hits"] = hits
out["codes"] = [d.code.value for d in grant.denials()]
proxy.close()
server.shutdown()
print(json.dumps(out))
"""


def test_a_dns_answer_naming_the_hosts_own_address_is_refused_like_loopback(
    tmp_path: Path,
) -> None:
    # A service bound to every interface answers on the host's LAN (or public) address as it
    # does on loopback: a name (even one in allow_private_domains) whose DNS answer was the
    # host's own address reached it. Played in a network namespace of the test's own.
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, check=False)
    if probe.returncode != 0 or not shutil.which("ip") or not shutil.which("curl"):
        pytest.skip("needs unshare -rn, ip and curl")
    driver = tmp_path / "driver.py"
    driver.write_text(_OWN_ADDRESS_DRIVER)
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        ["unshare", "-rn", sys.executable, str(driver)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=str(repo)),
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["hits"] == []
    assert "HOST-SECRET" not in out["mirror.corp.test"] + out["pkg.test"]
    assert "an address of this host" in out["mirror.corp.test"]
    assert out["codes"] == ["forbidden-address", "forbidden-address"]
