"""Bad input and hostile clients cost the proxy bounded time, and `close()` leaves nothing.

Slow clients here send a byte per tick on purpose (that is what a slowloris client is); the
proxy's reaction is awaited on the socket, never slept for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import select
import socket
import threading
import time
from pathlib import Path

import pytest

from bash_sandbox.egress import EgressProxy, ProxyLimits, Resolution
from tests.egress.conftest import ProxyFactory, curl, status_and_body
from tests.egress.servers import UpstreamServer, free_port_socket

FAST = ProxyLimits(request_head_timeout_s=0.5, idle_timeout_s=0.5, connect_timeout_s=2)


def _client(proxy: EgressProxy) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the proxy closes (the 10 s socket timeout fails a hang)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, b"bad request"),
        (b"GET /hello.txt HTTP/1.1\r\nHost: pkg.test\r\n\r\n", 400, b"this is a proxy"),
        (b"GET https://pkg.test/ HTTP/1.1\r\nHost: pkg.test\r\n\r\n", 400, b"use CONNECT"),
        (b"CONNECT pkg.test HTTP/1.1\r\nHost: pkg.test\r\n\r\n", 400, b"host:port"),
        (b"GET http://u:p@pkg.test/ HTTP/1.1\r\nHost: pkg.test\r\n\r\n", 400, b"bad host"),
        (b"GET http://pkg.test/ HTTP/1.1\r\n\r\n", 400, b"bad request"),  # no Host
    ],
)
def test_malformed_requests_get_a_clean_400(
    make_proxy: ProxyFactory, site: UpstreamServer, request_bytes: bytes, status: int, says: bytes
) -> None:
    proxy = make_proxy(allow=("pkg.test",))
    with _client(proxy) as sock:
        sock.sendall(request_bytes)
        reply = _read_all(sock)
    assert _status(reply) == status
    assert says in reply
    assert site.requests == []


def test_a_huge_header_block_gets_431_without_reading_it_all(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(allow=("pkg.test",), limits=ProxyLimits(max_header_bytes=8192))
    with _client(proxy) as sock:
        sock.sendall(b"GET http://pkg.test/ HTTP/1.1\r\nHost: pkg.test\r\n")
        sent = 0
        try:
            # Far past the bound; the proxy answers and closes long before the end.
            for _ in range(8192):
                sock.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
                sent += 1
        except OSError:
            pass  # reset by the proxy: it stopped reading, as it should
        reply = _read_all(sock)
    assert _status(reply) == 431
    assert sent < 8192


def test_a_slowloris_head_is_cut_off_with_408_and_others_are_served_meanwhile(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy(allow=("pkg.test",), limits=FAST)
    slow = [_client(proxy) for _ in range(8)]
    started = time.monotonic()
    for sock in slow:
        sock.sendall(b"GET http://pkg.test/ HTTP/1.1\r\n")
    # Served while eight clients dribble their heads.
    status, _ = status_and_body(curl(site.url("pkg.test", "/hello.txt"), proxy.environment()))
    assert status == "200"
    replies = []
    for sock in slow:
        with contextlib.suppress(OSError):
            for _ in range(200):  # a header byte per 20 ms, until the proxy answers
                if select.select([sock], [], [], 0)[0]:
                    break
                sock.sendall(b"X")
                time.sleep(0.02)
        replies.append(_read_all(sock))
        sock.close()
    elapsed = time.monotonic() - started
    assert all(_status(reply) == 408 for reply in replies)
    # Cut at the 0.5 s head timeout, not after the 4 s the dribble would have taken.
    assert elapsed < 2.5, elapsed
    assert len(site.requests) == 1


def test_a_client_that_connects_and_says_nothing_is_closed_in_time(
    make_proxy: ProxyFactory,
) -> None:
    proxy = make_proxy(limits=FAST)
    with _client(proxy) as sock:
        started = time.monotonic()
        reply = _read_all(sock)
    assert _status(reply) == 408
    assert time.monotonic() - started < 3


def _tunnel(
    proxy: EgressProxy, target: str, token: str | None = None
) -> tuple[socket.socket, bytes]:
    sock = _client(proxy)
    auth = b""
    if token is not None:
        auth = (
            b"Proxy-Authorization: Basic " + base64.b64encode(f"bsx-{token}:x".encode()) + b"\r\n"
        )
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n".encode() + auth + b"\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def test_an_idle_tunnel_is_closed_after_the_idle_timeout(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy(allow=("pkg.test",), limits=FAST)
    sock, head = _tunnel(proxy, f"pkg.test:{site.port}")
    assert head.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    assert sock.recv(1) == b""
    assert 0.3 < time.monotonic() - started < 3
    sock.close()


def test_total_connections_are_bounded_with_503(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy(limits=ProxyLimits(max_connections=3))
    grant = proxy.register(("pkg.test",))
    target = f"pkg.test:{site.port}"
    held = [_tunnel(proxy, target, grant.token) for _ in range(3)]  # each one at work
    assert all(head.startswith(b"HTTP/1.1 200") for _, head in held)
    with _client(proxy) as fourth:
        reply = _read_all(fourth)
    assert _status(reply) == 503
    for sock, _ in held:
        sock.close()


def test_silent_connections_never_hold_the_slots_of_others(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    # Whose a connection is becomes known with its head: one command that kept every slot
    # with connections that never sent one (reopened at each head timeout) starved every
    # other command of the executor (red team). The oldest silent one makes room.
    proxy = make_proxy(limits=ProxyLimits(max_connections=3))
    silent = [_client(proxy) for _ in range(3)]
    for sock in silent:
        sock.sendall(b"CONNECT pkg.test")  # a head never finished
    grant = proxy.register(("pkg.test",))
    sock, head = _tunnel(proxy, f"pkg.test:{site.port}", grant.token)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert _closed_by_peer(silent[0])  # the oldest silent one went
    sock.close()
    for each in silent:
        each.close()


def test_connections_per_grant_are_bounded_and_others_unaffected(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    proxy = make_proxy(limits=ProxyLimits(max_connections_per_grant=2))
    greedy = proxy.register(("pkg.test",))
    modest = proxy.register(("pkg.test",))
    target = f"pkg.test:{site.port}"
    open_ = [_tunnel(proxy, target, greedy.token) for _ in range(2)]
    assert all(head.startswith(b"HTTP/1.1 200") for _, head in open_)
    third, head = _tunnel(proxy, target, greedy.token)
    assert head.startswith(b"HTTP/1.1 503")
    other, head = _tunnel(proxy, target, modest.token)
    assert head.startswith(b"HTTP/1.1 200")
    for sock, _ in [*open_, (third, b""), (other, b"")]:
        sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """EOF, or a reset (the proxy closed with the client's bytes unread); a hang raises."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class ThreadedResolver:
    """Resolves on the loop's default executor (as `SystemResolver` does), from a table."""

    async def resolve(self, name: str) -> Resolution:
        import ipaddress

        loop = asyncio.get_running_loop()
        address = await loop.run_in_executor(None, ipaddress.ip_address, "127.0.0.1")
        return Resolution((address,), pinned=True)


def _join_once_started(thread: threading.Thread, timeout: float) -> None:
    # enumerate() lists a thread from inside its start(), before join() accepts it.
    deadline = time.monotonic() + timeout
    while True:
        try:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_close_leaves_no_fd_no_thread_and_no_listener(site: UpstreamServer, tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    fds_before = _fds()
    listen = free_port_socket()
    port = listen.getsockname()[1]
    proxy = EgressProxy(listen, allow=("pkg.test",), resolver=ThreadedResolver())
    proxy.start()
    grant = proxy.register(("pkg.test",))
    tunnel, head = _tunnel(proxy, f"pkg.test:{site.port}", grant.token)
    assert head.startswith(b"HTTP/1.1 200")
    dribbling = _client(proxy)
    dribbling.sendall(b"GET http://pkg.test/ HTTP/1.1\r\n")
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < 5
    proxy.close()  # idempotent
    assert _closed_by_peer(tunnel) and _closed_by_peer(dribbling)
    tunnel.close()
    dribbling.close()
    # The upstream test server's own per-connection threads (socketserver's) finish on
    # their own time, holding the upstream side's socket until then: waited for (bounded),
    # so their fd is not counted; every other thread must be gone already.
    left = {t for t in threading.enumerate() if "process_request_thread" not in t.name}
    assert left == {t for t in threads_before if "process_request_thread" not in t.name}
    for thread in threading.enumerate():
        if "process_request_thread" in thread.name and thread not in threads_before:
            _join_once_started(thread, timeout=10)
    assert _fds() == fds_before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert grant.closed


def test_lifecycle_errors_are_typed(make_proxy: ProxyFactory) -> None:
    from bash_sandbox.egress import EgressProxyError

    proxy = make_proxy()
    with pytest.raises(EgressProxyError) as caught:
        proxy.start()
    assert caught.value.code == "EGRESS_PROXY_STATE"
    proxy.close()
    with pytest.raises(EgressProxyError):
        proxy.register(("pkg.test",))
    unlistened = socket.socket()
    unlistened.bind(("127.0.0.1", 0))
    with pytest.raises(EgressProxyError):
        EgressProxy(unlistened)
    unlistened.close()
    never_started = EgressProxy(free_port_socket())
    never_started.close()
    with pytest.raises(EgressProxyError):
        never_started.start()


def test_connections_without_a_token_have_a_small_count_of_their_own(
    make_proxy: ProxyFactory, site: UpstreamServer
) -> None:
    # One command's 64 tunnels under its token plus 64 without one held every slot of the
    # executor's 128 (red team): requests without a token share 8.
    proxy = make_proxy(("pkg.test",), limits=ProxyLimits(max_connections_anonymous=2))
    target = f"pkg.test:{site.port}"
    anonymous = [_tunnel(proxy, target, None) for _ in range(3)]
    heads = [head for _, head in anonymous]
    assert [h[:12] for h in heads] == [b"HTTP/1.1 200", b"HTTP/1.1 200", b"HTTP/1.1 503"], heads
    for sock, _ in anonymous:
        sock.close()
