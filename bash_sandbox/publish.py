"""Publishing a sandbox port to the host: `start(..., publish=[3000])`.

Under ``network="isolated"`` a confined command's server listens in the executor's own
network namespace, unreachable from the host (the user's browser, a harness's browser tool).
On request, the executor opens a listening socket on a free port of the host's ``127.0.0.1``
(the URL says which) and a small relay process
(`publish_relay.py`) that joins the executor's network namespace and carries each accepted
connection to ``127.0.0.1:<port>`` inside. Nothing else changes: the sandbox still has no
route out, and only what the host connects to the published port reaches the sandbox.

- A free port, not the port number asked for: a host client expecting a service of its own
  on that port (a database, a cache) must never reach the sandbox's server instead and hand
  it a password. The operator may ask for the same number (`publish_same_port`), taken only
  when free.
- Loopback only, unless the executor's config names another `publish_host` (an operator's
  decision, never a call's).
- Bounded: 64 connections per port at a time, 600 s idle, 16 ports per publication, 16
  publications (relay processes) open per executor.
- Lifetime: a publication made for a background task is closed when the task settles (its
  `wait()` returns: finished, killed or aborted), or when the executor closes; the relay
  dies with the executor's process too. Closing kills the relay by pid, which closes the
  host ports.
- Under ``network="host"`` (and danger-full-access) the command listens on the host
  already: the URL is reported and no relay runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bash_sandbox.linux.namespaces import NamespaceFds

MAX_PORTS = 16
MAX_PUBLICATIONS = 16  # open at once per executor: each is a relay process
READY_TIMEOUT_S = 10.0
_RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "publish_relay.py")


class PublishError(Exception):
    """A port could not be published; nothing was left open."""

    code = "PUBLISH_FAILED"


def check_ports(ports: Sequence[int]) -> tuple[int, ...]:
    """``ports`` validated: integers 1-65535, at most `MAX_PORTS`, duplicates dropped."""
    out: dict[int, None] = {}
    for port in ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise PublishError(f"publish: {port!r} is not a TCP port (1-65535)")
        out[port] = None
    if len(out) > MAX_PORTS:
        raise PublishError(f"publish: at most {MAX_PORTS} ports at a time")
    return tuple(out)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(host: str, port: int) -> socket.socket:
    """A host socket listening on ``host:port`` (0: a free port), or on a free port when
    that one is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            sock.bind((host, 0))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class Publication:
    """Published ports: ``urls`` maps each sandbox port to the host URL that reaches it."""

    urls: dict[int, str]
    _relay: subprocess.Popen[bytes] | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def relay_pid(self) -> int | None:
        return self._relay.pid if self._relay is not None else None

    def close(self) -> None:
        """Kill the relay (by pid) and reap it, which closes the host ports. Idempotent."""
        if self._closed:
            return
        self._closed = True
        relay = self._relay
        if relay is not None:
            with contextlib.suppress(ProcessLookupError):
                relay.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.wait(5)
            for stream in (relay.stdout, relay.stderr):
                if stream is not None:
                    stream.close()


def open_publication(
    ports: Sequence[int],
    namespaces: NamespaceFds | None,
    *,
    host: str = "127.0.0.1",
    same_port: bool = False,
) -> Publication:
    """Publish ``ports`` of the namespace ``namespaces`` (None: the command shares the
    host's network, so the ports are reported, not relayed). Blocking: call it in a thread.
    Raises `PublishError`."""
    wanted = check_ports(ports)
    if namespaces is None:
        return Publication({port: _url(host, port) for port in wanted})
    listeners: list[socket.socket] = []
    try:
        for port in wanted:
            listeners.append(_listen(host, port if same_port else 0))
    except OSError as exc:
        for sock in listeners:
            sock.close()
        raise PublishError(f"publish: cannot listen on {host}: {exc.strerror or exc}") from None
    user = str(namespaces.user) if namespaces.user is not None else "-"
    pairs = [f"{s.fileno()}:{p}" for s, p in zip(listeners, wanted, strict=True)]
    fds = [namespaces.net, *([namespaces.user] if namespaces.user is not None else [])]
    try:
        relay = subprocess.Popen(
            [sys.executable, "-I", _RELAY, str(os.getpid()), str(namespaces.net), user, *pairs],
            pass_fds=[*fds, *(s.fileno() for s in listeners)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's ^C goes to the CLI, which closes us
        )
    except OSError as exc:
        raise PublishError(f"publish: cannot start the relay: {exc}") from None
    finally:
        urls = {p: _url(host, s.getsockname()[1]) for s, p in zip(listeners, wanted, strict=True)}
        for sock in listeners:
            sock.close()  # the relay holds them now: its death closes the host ports
    publication = Publication(urls, relay)
    assert relay.stdout is not None and relay.stderr is not None
    poller = select.poll()  # not select(): a descriptor may be numbered past 1,024
    poller.register(relay.stdout.fileno(), select.POLLIN)
    ready = poller.poll(READY_TIMEOUT_S * 1000)
    line = relay.stdout.readline() if ready else b""
    if line != b"ready\n":
        publication.close()
        detail = relay.stderr.read(2000).decode("utf-8", "replace").strip() if ready else ""
        raise PublishError(f"publish: the relay did not start ({detail or 'no answer'})")
    return publication


class Publications:
    """An executor's open publications, by the background task they belong to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_task: dict[str, Publication] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        # An executor dropped without aclose() still ends its relays.
        self._finalizer = weakref.finalize(self, _close_all, self._by_task, self._lock)

    def check_room(self) -> None:
        """Raise `PublishError` when the executor already has `MAX_PUBLICATIONS` open."""
        with self._lock:
            if len(self._by_task) >= MAX_PUBLICATIONS:
                raise PublishError(
                    f"publish: {MAX_PUBLICATIONS} tasks already publish ports; end one first"
                )

    def urls(self, process_id: str) -> dict[int, str]:
        with self._lock:
            publication = self._by_task.get(process_id)
        return dict(publication.urls) if publication is not None else {}

    def track(self, process_id: str, publication: Publication, settled: asyncio.Task[None]) -> None:
        """Keep ``publication`` open until ``settled`` (the task's `wait()`) is done."""
        with self._lock:
            self._by_task[process_id] = publication

        def done(_: asyncio.Task[None]) -> None:
            with self._lock:
                self._by_task.pop(process_id, None)
            publication.close()
            self._watchers.discard(settled)

        self._watchers.add(settled)
        settled.add_done_callback(done)

    def close_all(self) -> None:
        _close_all(self._by_task, self._lock)


def _close_all(by_task: dict[str, Publication], lock: threading.Lock) -> None:
    with lock:
        publications = list(by_task.values())
        by_task.clear()
    for publication in publications:
        publication.close()
