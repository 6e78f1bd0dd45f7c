"""Upstream servers, a throwaway CA and a resolver for egress tests; importable by other suites.

Everything listens on the host's 127.0.0.1 only and is reached through test host names
that a `StaticResolver` maps there, so no byte leaves the machine.

- `ThrowawayCA`: a trustme CA; `server_context(names)` for upstreams, `ca_file` for clients.
- `UpstreamServer`: a threaded HTTP(S) server serving a directory (a PEP 503 simple index,
  a dumb-HTTP git repository, npm packuments) and recording every request it saw, so a test
  checks from outside what reached it.
- `make_simple_index`, `make_dumb_git_repo`, `make_npm_registry`: content for those tools.
- ``python -m tests.egress.servers --bulk DIR``: a separate process serving DIR's files with
  sendfile (the benchmark's upstream); prints its port, serves until stdin closes.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from bash_sandbox.egress import StaticResolver


def resolver_for(names: Iterable[str], *, pinned: bool = True) -> StaticResolver:
    """Every name at 127.0.0.1 (where the test servers listen)."""
    return StaticResolver(dict.fromkeys(names, "127.0.0.1"), pinned=pinned)


class ThrowawayCA:
    """A CA made for one test session; its key never leaves memory and a temp file."""

    def __init__(self, directory: Path) -> None:
        self._ca = trustme.CA()
        self.ca_file = directory / "throwaway-ca.pem"
        self._ca.cert_pem.write_to_path(str(self.ca_file))

    def server_context(self, names: Iterable[str]) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ca.issue_cert(*names).configure_cert(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


@dataclass(frozen=True)
class SeenRequest:
    """One request as the upstream received it."""

    method: str
    path: str
    headers: dict[str, str]


class _RecordingHandler(http.server.SimpleHTTPRequestHandler):
    server: _RecordingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read `requests`, not stderr

    def _record(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        with self.server.lock:
            self.server.seen.append(SeenRequest(self.command, self.path, headers))

    def do_GET(self) -> None:
        self._record()
        if self.path.split("?")[0] in self.server.routes:
            body, content_type = self.server.routes[self.path.split("?")[0]]
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def do_HEAD(self) -> None:
        self._record()
        super().do_HEAD()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline() not in (b"\r\n", b""):
            pass  # trailers
        return body

    def do_POST(self) -> None:
        """Answers the SHA-256 of the body it received, so a test compares both ends."""
        self._record()
        body = self._read_body()
        reply = hashlib.sha256(body).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class _RecordingHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True

    def __init__(self, handler: Any) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.lock = threading.Lock()
        self.seen: list[SeenRequest] = []
        self.routes: dict[str, tuple[bytes, str]] = {}


class UpstreamServer:
    """Serves ``root`` over HTTP, or HTTPS with ``tls``, on 127.0.0.1; records requests."""

    def __init__(self, root: Path, *, tls: ssl.SSLContext | None = None) -> None:
        handler = functools.partial(_RecordingHandler, directory=str(root))
        self._server = _RecordingHTTPServer(handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def route(self, path: str, body: bytes, content_type: str = "application/json") -> None:
        """Answer GET ``path`` with ``body`` (ahead of the directory)."""
        self._server.routes[path] = (body, content_type)

    @property
    def requests(self) -> list[SeenRequest]:
        with self._server.lock:
            return list(self._server.seen)

    def url(self, host: str, path: str = "/") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def __enter__(self) -> UpstreamServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def make_simple_index(root: Path, *, project: str = "egress-probe", version: str = "1.0") -> str:
    """A PEP 503 index under ``root/simple`` holding one pure-Python wheel; its file name."""
    import base64
    import zipfile

    dist = project.replace("-", "_")
    wheel_name = f"{dist}-{version}-py3-none-any.whl"
    files = {
        f"{dist}/__init__.py": b"VALUE = 42\n",
        f"{dist}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
        ).encode(),
        f"{dist}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record_lines = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{name},sha256={digest},{len(data)}")
    record_name = f"{dist}-{version}.dist-info/RECORD"
    record_lines.append(f"{record_name},,")
    files[record_name] = ("\n".join(record_lines) + "\n").encode()
    project_dir = root / "simple" / project
    project_dir.mkdir(parents=True)
    wheel = project_dir / wheel_name
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (project_dir / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{wheel_name}#sha256={sha}">{wheel_name}</a>'
        "</body></html>\n"
    )
    (root / "simple" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{project}/">{project}</a></body></html>\n'
    )
    return wheel_name


def make_dumb_git_repo(root: Path, *, name: str = "probe.git") -> str:
    """A bare repository under ``root`` with one commit, prepared for dumb HTTP; its HEAD."""
    work = root / "work"
    bare = root / name
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(root),
    }

    def git(*args: str, cwd: Path = root) -> str:
        out = subprocess.run(
            ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
        )
        return out.stdout.strip()

    work.mkdir()
    git("init", "-q", "-b", "main", str(work))
    (work / "README").write_text("probe\n")
    git("add", "README", cwd=work)
    git("commit", "-q", "-m", "probe", cwd=work)
    git("clone", "-q", "--bare", str(work), str(bare))
    git("update-server-info", cwd=bare)
    shutil.rmtree(work)
    return git("rev-parse", "HEAD", cwd=bare)


def npm_packument(name: str, version: str, tarball_url: str) -> bytes:
    """The registry document `npm view NAME` reads."""
    return json.dumps(
        {
            "name": name,
            "dist-tags": {"latest": version},
            "versions": {
                version: {
                    "name": name,
                    "version": version,
                    "description": "egress probe",
                    "dist": {"tarball": tarball_url, "shasum": "0" * 40},
                }
            },
            "time": {version: "2026-01-01T00:00:00.000Z"},
        }
    ).encode()


class BulkProcess:
    """``--bulk DIR`` in a child process (see the module docstring); `.port` once ready."""

    def __init__(self, directory: Path, *, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: (certificate chain, key) PEM files: serve HTTPS with them."""
        argv = [sys.executable, "-m", "tests.egress.servers", "--bulk", str(directory)]
        if tls is not None:
            argv += ["--tls", str(tls[0]), str(tls[1])]
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self._proc.stdout is not None
        self.port = int(self._proc.stdout.readline())

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=10)


def _serve_bulk(directory: Path, tls: tuple[str, str] | None = None) -> None:
    class Bulk(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = directory / Path(self.path).name
            if not path.is_file():
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(path.stat().st_size))
            self.end_headers()
            self.wfile.flush()
            with path.open("rb") as f:
                self.connection.sendfile(f)  # zero-copy: the baseline is not held back

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bulk)
    server.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # the parent closes stdin to stop us
    server.shutdown()


def free_port_socket() -> socket.socket:
    """A listening socket on 127.0.0.1 in the current namespace, for a proxy under test."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bulk", type=Path, required=True)
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = parser.parse_args()
    _serve_bulk(args.bulk, tuple(args.tls) if args.tls else None)


if __name__ == "__main__":
    _main()


def listening_socket_in_netns(netns_fd: int) -> socket.socket:
    """A socket listening on 127.0.0.1:0 *inside* the namespace ``netns_fd`` (what the
    executor hands the proxy): a short-lived thread joins the namespace, makes it, exits."""
    import ctypes

    from bash_sandbox.linux.child_setup import CLONE_NEWNET, libc

    made: dict[str, Any] = {}

    def worker() -> None:
        try:
            if libc().setns(netns_fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET)")
            made["socket"] = free_port_socket()
        except BaseException as exc:
            made["error"] = exc

    thread = threading.Thread(target=worker, name="test-netns-listener")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    sock: socket.socket = made["socket"]
    return sock
