"""`EgressProxy`: the HTTP proxy that lets a confined command reach its allowlist, and nothing else.

The executor makes the listening socket inside the command's network namespace (bound to
127.0.0.1 there, no route out) and hands it over; the proxy accepts on it and opens its
upstream connections with ordinary sockets in the executor's own namespace. So the proxy is
the only way out of the namespace, and every way out passes `admit()`.

What it speaks (HTTP/1.1, parsed by h11, never by hand):

- ``CONNECT host:port``: a blind tunnel (TLS stays end to end) once the destination is
  admitted; ``200`` then bytes both ways (`relay`).
- ``GET http://host[:port]/path`` and the other methods with an absolute ``http://`` URL:
  forwarded on a fresh upstream connection per request, hop-by-hop headers dropped (the
  grant token in ``Proxy-Authorization`` never leaves), the client connection kept alive.
- Anything else (origin-form targets, ``https://`` absolute URLs, malformed requests) is
  answered 400; a head over `ProxyLimits.max_header_bytes` 431; a head that does not arrive
  in time 408; a refused destination 403 with a one-line reason in the status line and the
  body, recorded as an `EgressDenial` on the asking grant.

Threading: `start()` runs the proxy on its own thread with its own asyncio loop, so it never
blocks on, or waits for, the executor's loop. `register()`, `ProxyGrant` methods and
`close()` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from bash_sandbox.egress.admission import (
    EgressDenial,
    EgressDenialCode,
    EgressRefused,
    admit,
    printable,
)
from bash_sandbox.egress.credentials import CredentialVault
from bash_sandbox.egress.environment import proxy_environment
from bash_sandbox.egress.grants import GrantTable, ProxyGrant, token_from_proxy_authorization
from bash_sandbox.egress.http_headers import forwardable
from bash_sandbox.egress.intercept import InterceptedTunnel
from bash_sandbox.egress.limits import ProxyLimits
from bash_sandbox.egress.resolver import IPAddress, ResolutionError, Resolver, SystemResolver
from bash_sandbox.egress.tunnel import relay
from policies.egress import EgressRule, parse_private_domains, split_host_port

_log = logging.getLogger(__name__)

_RECV_BYTES = 64 * 1024
# Writing an error response to a client that does not read must not hold its connection.
_ANSWER_TIMEOUT_S = 5.0
# After an error response: how long, and how much, to drain before closing (see `_answer`).
_LINGER_S = 1.0
_LINGER_BYTES = 1 << 20
# How long a forwarded request's body may still be arriving once its response is complete.
_BODY_GRACE_S = 1.0


# Dropped when forwarding, both ways (RFC 9110 7.6.1), plus the proxy's own credentials.
class EgressProxyError(RuntimeError):
    """The proxy was used out of order (started twice, used after close, failed to start)."""

    code = "EGRESS_PROXY_STATE"


def _error_response(status: int, message: str) -> tuple[h11.Response, bytes]:
    body = (message + "\n").encode("ascii", "replace")
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return h11.Response(status_code=status, headers=headers, reason=message.encode()), body


def _overloaded_bytes() -> bytes:
    # Sent before reading anything, so rendered once with a fresh h11 server connection.
    conn = h11.Connection(h11.SERVER)
    response, body = _error_response(503, "bash-sandbox: too many proxy connections")
    return conn.send(response) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())


_OVERLOADED = _overloaded_bytes()


class _ClientGone(Exception):
    """The client closed, reset, or idled out between requests: close without answering."""


class _HeadTimeout(Exception):
    """The request head did not complete in time: answer 408."""


_UNATTACHED = object()


@dataclass
class _Client:
    """One accepted connection, as the loop tracks it."""

    sock: socket.socket
    key: object = _UNATTACHED  # the grant token it counts against (None: anonymous)
    grant: ProxyGrant | None = None


@dataclass
class _Exchange:
    """One request being served: the client's h11 state and socket, and who is asking."""

    conn: h11.Connection
    sock: socket.socket
    grant: ProxyGrant | None
    rules: tuple[EgressRule, ...]


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


class EgressProxy:
    """An HTTP proxy serving an allowlist on a listening socket it is handed.

    ``listen_socket`` must be bound and listening; the proxy owns it from here on and closes
    it in `close()`. ``allow`` is the executor's base list: it applies to requests that
    carry no valid grant token. ``resolver`` defaults to the host's (`SystemResolver`).
    ``allow_private``: the names (`allow_private_domains`) whose private DNS answers are
    used; the operator's pins (a `PinnedResolver`) need no entry. ``credentials``: the
    secrets to inject; their domains' CONNECTs are terminated here (`intercept.py`).
    """

    def __init__(
        self,
        listen_socket: socket.socket,
        *,
        allow: tuple[str, ...] = (),
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
        allow_private: tuple[str, ...] = (),
        credentials: CredentialVault | None = None,
    ) -> None:
        if (
            listen_socket.family not in (socket.AF_INET, socket.AF_INET6)
            or listen_socket.type != socket.SOCK_STREAM
            or not listen_socket.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        ):
            raise EgressProxyError(
                "the proxy needs a bound, listening TCP socket (call listen() first)"
            )
        self._limits = limits if limits is not None else ProxyLimits()
        self._grants = GrantTable(allow, max_denials=self._limits.max_denials_per_grant)
        self._private = parse_private_domains(allow_private)
        self._vault = credentials
        self._listen = listen_socket
        # More listeners on the same address in other network namespaces (`add_listener`).
        self._more: list[socket.socket] = []
        self._listening = False
        self._host, self._port = listen_socket.getsockname()[:2]
        self._resolver: Resolver = resolver if resolver is not None else SystemResolver()
        self._state = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        # Touched only on the proxy's loop:
        self._stop: asyncio.Event | None = None
        self._accepting: list[asyncio.Task[None]] = []
        self._clients: dict[asyncio.Task[None], _Client] = {}
        self._per_grant: Counter[object] = Counter()

    # -- the executor's side (any thread) ------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """Where the proxy listens (inside the namespace it was made in)."""
        return self._host, self._port

    @property
    def base_allow(self) -> tuple[str, ...]:
        return tuple(rule.text for rule in self._grants.base_rules)

    def environment(self) -> dict[str, str]:
        """Proxy variables without a token: requests are served under the base list."""
        return proxy_environment(self._host, self._port, None)

    def register(self, allow: tuple[str, ...]) -> ProxyGrant:
        """A grant for one command, allowed ``allow`` (the executor's list plus any approved
        per-call addition). Raises `EgressRuleError` for a bad entry."""
        with self._state:
            if self._closed:
                raise EgressProxyError("the egress proxy is closed; register before close()")
        vault = self._vault

        def environment(token: str) -> dict[str, str]:
            env = proxy_environment(self._host, self._port, token)
            return env | vault.sandbox_environment() if vault is not None else env

        return self._grants.register(allow, environment=environment, on_close=self._grant_closed)

    def add_listener(self, listen_socket: socket.socket) -> None:
        """Also serve ``listen_socket``: bound, listening, on `address` (in another network
        namespace: one per trust domain). The proxy owns it from here on."""
        if listen_socket.getsockname()[:2] != (self._host, self._port):
            raise EgressProxyError("another listener must be bound to the proxy's address")
        with self._state:
            if self._closed:
                listen_socket.close()
                raise EgressProxyError("the egress proxy is closed")
            self._more.append(listen_socket)
            # Once `_main` took its list, a later one is handed to its loop.
            loop = self._loop if self._listening else None
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # stopped meanwhile: `_run` closes it
                loop.call_soon_threadsafe(self._accept_on, listen_socket)

    def start(self) -> None:
        """Serve on a new thread; returns once the proxy accepts connections."""
        with self._state:
            if self._closed or self._thread is not None:
                raise EgressProxyError("start() may be called once, before close()")
            self._thread = threading.Thread(
                target=self._run, name="bash-sandbox-egress", daemon=True
            )
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise EgressProxyError(f"the egress proxy failed to start: {self._failure}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, close every connection and the listening socket, end the thread.

        Idempotent. Blocks at most ``timeout_s`` for the thread (wrap it in
        `asyncio.to_thread` from a loop). Grants stay readable (their denials) but closed.
        """
        with self._state:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        self._grants.close_all()
        if thread is None:
            self._close_listeners()
            return
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended on its own
                loop.call_soon_threadsafe(self._request_stop)
        thread.join(timeout_s)

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _grant_closed(self, grant: ProxyGrant) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # loop closed: its connections are gone
            loop.call_soon_threadsafe(self._drop_connections_of, grant)

    # -- the proxy's thread and loop ------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:
            self._failure = exc
            _log.exception("egress proxy stopped")
        finally:
            self._ready.set()  # start() must never wait forever
            with contextlib.suppress(Exception):
                # getaddrinfo threads of the SystemResolver; bounded so close() is too.
                loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), 5))
            loop.close()
            self._close_listeners()

    def _close_listeners(self) -> None:
        with self._state:
            more, self._more = self._more, []
        for sock in (self._listen, *more):
            sock.close()

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        with self._state:
            listeners = [self._listen, *self._more]
            self._listening = True
        for listen in listeners:
            self._accept_on(listen)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            for task in self._accepting:
                task.cancel()
            clients = list(self._clients)
            for task in clients:
                task.cancel()
            await asyncio.gather(*self._accepting, *clients, return_exceptions=True)
            # Dropped now: a connection accepted as its task was cancelled is closed with it.
            self._accepting.clear()

    def _accept_on(self, listen: socket.socket) -> None:
        if self._stop is None or self._stop.is_set():
            return  # stopping: `_run` closes the socket
        listen.setblocking(False)
        self._accepting.append(asyncio.create_task(self._accept_loop(listen)))

    async def _accept_loop(self, listen: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listen)
            except OSError as exc:
                # EMFILE and friends: back off briefly rather than spin on the ready socket.
                _log.warning("egress proxy accept failed: %s", exc)
                await asyncio.sleep(0.05)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):  # a client already gone is served nothing
                # Heads and bodies go out as separate writes: without this, Nagle holds the
                # second one for the client's delayed ACK (40 ms per forwarded response).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if len(self._clients) >= self._limits.max_connections and not self._evict_waiting():
                with contextlib.suppress(OSError):
                    sock.send(_OVERLOADED)
                sock.close()
                continue
            client = _Client(sock)
            task = asyncio.create_task(self._serve(client))
            self._clients[task] = client
            task.add_done_callback(self._forget)

    def _evict_waiting(self) -> bool:
        """Make room by closing the oldest connection that has not sent a request head yet.

        Which command a connection is becomes known only with its head (the grant token),
        and every command of the executor shares this listener: one that held every slot
        with silent connections, reopening each at its head timeout, starved the others
        (red team). A client that sends its head at once never stays the oldest waiting."""
        for task, client in self._clients.items():
            if client.key is _UNATTACHED:
                task.cancel()
                self._clients.pop(task, None)
                return True
        return False

    def _forget(self, task: asyncio.Task[None]) -> None:
        client = self._clients.pop(task, None)
        if client is not None and client.key is not _UNATTACHED:
            self._per_grant[client.key] -= 1

    def _drop_connections_of(self, grant: ProxyGrant) -> None:
        for task, client in self._clients.items():
            if client.grant is grant:
                task.cancel()

    def _attach(self, client: _Client, grant: ProxyGrant | None) -> bool:
        """Count ``client`` against ``grant``'s connections; False when that is over the limit."""
        key: object = grant.token if grant is not None else None
        if client.key != key:
            limits = self._limits
            most = limits.max_connections_per_grant if grant else limits.max_connections_anonymous
            if self._per_grant[key] >= most:
                return False
            if client.key is not _UNATTACHED:
                self._per_grant[client.key] -= 1
            self._per_grant[key] += 1
            client.key = key
        client.grant = grant
        return True

    # -- one client connection ------------------------------------------------------------

    async def _serve(self, client: _Client) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes)
        try:
            first = True
            while True:
                try:
                    request = await self._read_request(conn, client.sock, first=first)
                except _HeadTimeout:
                    await _answer(conn, client.sock, 408, "bash-sandbox: request timeout")
                    return
                except h11.RemoteProtocolError as exc:
                    status = exc.error_status_hint
                    text = "request header fields too large" if status == 431 else "bad request"
                    await _answer(conn, client.sock, status, f"bash-sandbox: {text}")
                    return
                first = False
                token = token_from_proxy_authorization(
                    _header(request.headers, b"proxy-authorization") or b""
                )
                grant = self._grants.lookup(token)
                if not self._attach(client, grant):
                    text = "bash-sandbox: too many proxy connections for this command"
                    await _answer(conn, client.sock, 503, text)
                    return
                rules = grant.rules if grant is not None else self._grants.base_rules
                exchange = _Exchange(conn, client.sock, grant, rules)
                if request.method == b"CONNECT":
                    await self._tunnel(exchange, request)
                    return
                if not await self._forward(exchange, request):
                    return
                conn.start_next_cycle()
        except _ClientGone:
            pass
        except Exception:
            # A bug must cost one connection, never the proxy.
            _log.exception("egress proxy connection failed")
        finally:
            client.sock.close()

    async def _read_request(
        self, conn: h11.Connection, sock: socket.socket, *, first: bool
    ) -> h11.Request:
        """The next request head. The first must arrive within the head timeout of accept;
        a kept-alive connection may idle, then has the head timeout from its first byte."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        if first or conn.trailing_data[0]:
            deadline = loop.time() + self._limits.request_head_timeout_s
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Request):
                return event
            if event is not h11.NEED_DATA:
                raise _ClientGone  # ConnectionClosed, or a client that sent after EOF
            wait = self._limits.idle_timeout_s if deadline is None else deadline - loop.time()
            try:
                async with asyncio.timeout(max(wait, 0)):
                    data = await loop.sock_recv(sock, _RECV_BYTES)
            except TimeoutError:
                raise (_ClientGone if deadline is None else _HeadTimeout) from None
            except OSError:
                raise _ClientGone from None
            if deadline is None:
                deadline = loop.time() + self._limits.request_head_timeout_s
            conn.receive_data(data)

    async def _open_upstream(self, ex: _Exchange, host: str, port: int) -> socket.socket | None:
        """A connected upstream socket for an admitted destination, or None once the client
        has been answered (403 refused, 502 unreachable, 504 too slow)."""
        budget = self._limits.connect_timeout_s
        shown = printable(f"{host}:{port}")
        try:
            async with asyncio.timeout(budget):
                admission = await admit(ex.rules, host, port, self._resolver, private=self._private)
                if admission.pinned_by is not None:
                    addresses = ", ".join(map(str, admission.addresses))
                    text = (
                        f"egress: {admission.destination.name} reached at {addresses}, "
                        f"pinned by {admission.pinned_by} (DNS not asked)"
                    )
                    self._grants.note(ex.grant, text)
                    _log.info("%s", text)
                return await _connect_any(admission.addresses, port)
        except EgressRefused as refused:
            self._grants.record(ex.grant, refused.denial)
            await _answer(ex.conn, ex.sock, 403, refused.denial.message())
        except ResolutionError as exc:
            await _answer(ex.conn, ex.sock, 502, f"bash-sandbox: {printable(str(exc))}")
        except TimeoutError:
            text = f"bash-sandbox: {shown} did not answer within {budget:g} s"
            await _answer(ex.conn, ex.sock, 504, text)
        except OSError as exc:
            text = f"bash-sandbox: cannot connect to {shown}: {exc.strerror or exc}"
            await _answer(ex.conn, ex.sock, 502, text)
        return None

    async def _tunnel(self, ex: _Exchange, request: h11.Request) -> None:
        target = request.target.decode("ascii", "replace")
        try:
            host, port = split_host_port(target)
        except ValueError:
            port = None
        if port is None:
            await _answer(ex.conn, ex.sock, 400, "bash-sandbox: CONNECT needs host:port")
            return
        upstream = await self._open_upstream(ex, host, port)
        if upstream is None:
            return
        loop = asyncio.get_running_loop()
        domain = host.lower().rstrip(".")
        try:
            established = h11.Response(
                status_code=200, headers=[], reason=b"Connection established"
            )
            await loop.sock_sendall(ex.sock, ex.conn.send(established))
            early, _ = ex.conn.trailing_data  # bytes the client sent right after its head
            if self._vault is not None and domain in self._vault.domains:
                if not early:  # a client that did not wait for the 200 is not served
                    await self._intercept(ex, upstream, domain, port)
                return
            if early:
                await loop.sock_sendall(upstream, early)
            await relay(ex.sock, upstream, idle_timeout_s=self._limits.idle_timeout_s)
        except OSError:
            pass
        finally:
            upstream.close()

    async def _intercept(
        self, ex: _Exchange, upstream: socket.socket, domain: str, port: int
    ) -> None:
        """Serve a credential domain's tunnel with TLS terminated here, on a thread of its
        own (blocking TLS); cancelling this (a grant closed, the proxy closing) aborts it."""
        assert self._vault is not None
        tunnel = InterceptedTunnel(
            client=ex.sock,
            upstream=upstream,
            domain=domain,
            port=port,
            vault=self._vault,
            limits=self._limits,
            record=lambda denial: self._grants.record(ex.grant, denial),
        )
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def serve() -> None:
            try:
                tunnel.run()
            finally:
                tunnel.close()
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(_settle, finished)

        threading.Thread(target=serve, name="bash-sandbox-egress-tls", daemon=True).start()
        try:
            await finished
        finally:
            tunnel.abort()

    async def _forward(self, ex: _Exchange, request: h11.Request) -> bool:
        """Forward one absolute-URL request; True when the client connection may be reused."""
        target = request.target.decode("ascii", "replace")
        if target.startswith("/") or target == "*":
            text = "bash-sandbox: this is a proxy; send an absolute http:// URL, or CONNECT"
            await _answer(ex.conn, ex.sock, 400, text)
            return False
        parts = urlsplit(target)
        if parts.scheme.lower() != "http":
            text = "bash-sandbox: only http:// URLs are forwarded; use CONNECT for TLS"
            await _answer(ex.conn, ex.sock, 400, text)
            return False
        try:
            if not parts.netloc or "@" in parts.netloc:
                raise ValueError(parts.netloc)
            host, port = split_host_port(parts.netloc)
        except ValueError:
            await _answer(ex.conn, ex.sock, 400, "bash-sandbox: bad host in the request URL")
            return False
        if self._vault is not None:
            # Plain HTTP: no credential is injected here, and no placeholder may leave.
            owner = self._vault.foreign_placeholder(None, request.target, request.headers)
            if owner is not None:
                denial = EgressDenial(
                    host=printable(host, 80),
                    port=port or 80,
                    code=EgressDenialCode.CREDENTIAL_ELSEWHERE,
                    reason=f"carries the placeholder of the credential for {owner} over http",
                )
                self._grants.record(ex.grant, denial)
                await _answer(ex.conn, ex.sock, 403, denial.message())
                return False
        upstream = await self._open_upstream(ex, host, port or 80)
        if upstream is None:
            return False
        try:
            path = parts.path or "/"
            if parts.query:
                path = f"{path}?{parts.query}"
            up = h11.Connection(h11.CLIENT, max_incomplete_event_size=self._limits.max_header_bytes)
            headers = [
                (b"host", parts.netloc.encode("ascii")),
                *((k, v) for k, v in forwardable(request.headers) if k != b"host"),
                (b"connection", b"close"),  # one request per upstream connection
            ]
            outgoing = h11.Request(method=request.method, target=path.encode(), headers=headers)
            await asyncio.get_running_loop().sock_sendall(upstream, up.send(outgoing))
            body = asyncio.create_task(self._pump_request_body(ex, up, upstream))
            try:
                answered = await self._pump_response(ex, up, upstream)
                if answered and not body.done():
                    # A fast upstream can answer before the body task even read the
                    # request's end (a bodiless GET); give it a moment, then give up.
                    await asyncio.wait({body}, timeout=_BODY_GRACE_S)
            finally:
                if not body.done():
                    body.cancel()
                await asyncio.gather(body, return_exceptions=True)
            return answered and ex.conn.our_state is h11.DONE and ex.conn.their_state is h11.DONE
        except (OSError, h11.ProtocolError):
            await _answer(ex.conn, ex.sock, 502, "bash-sandbox: the upstream connection failed")
            return False
        finally:
            upstream.close()

    async def _recv(self, sock: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._limits.idle_timeout_s):
            return await loop.sock_recv(sock, _RECV_BYTES)

    async def _pump_request_body(
        self, ex: _Exchange, up: h11.Connection, upstream: socket.socket
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            event = ex.conn.next_event()
            if event is h11.NEED_DATA:
                ex.conn.receive_data(await self._recv(ex.sock))
            elif isinstance(event, h11.Data):
                await loop.sock_sendall(upstream, up.send(h11.Data(data=event.data)))
            elif isinstance(event, h11.EndOfMessage):
                await loop.sock_sendall(upstream, up.send(h11.EndOfMessage()))
                return
            else:
                return  # the client went away mid-body; the response side notices

    async def _pump_response(
        self, ex: _Exchange, up: h11.Connection, upstream: socket.socket
    ) -> bool:
        """Relay the upstream response; True when it was relayed completely."""
        loop = asyncio.get_running_loop()
        started = False
        failure = "bash-sandbox: the upstream closed without answering"
        try:
            while True:
                event = up.next_event()
                if event is h11.NEED_DATA:
                    up.receive_data(await self._recv(upstream))
                    continue
                if isinstance(event, h11.InformationalResponse):
                    if event.status_code != 101:  # no protocol switch: Upgrade was dropped
                        interim = h11.InformationalResponse(
                            status_code=event.status_code, headers=forwardable(event.headers)
                        )
                        await loop.sock_sendall(ex.sock, ex.conn.send(interim))
                    continue
                if isinstance(event, h11.Response):
                    started = True
                    response = h11.Response(
                        status_code=event.status_code,
                        headers=forwardable(event.headers),
                        reason=event.reason,
                    )
                    await loop.sock_sendall(ex.sock, ex.conn.send(response))
                elif isinstance(event, h11.Data):
                    await loop.sock_sendall(ex.sock, ex.conn.send(h11.Data(data=event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    await loop.sock_sendall(ex.sock, ex.conn.send(h11.EndOfMessage()))
                    return True
                else:
                    break  # closed before the response ended
        except TimeoutError:
            failure = "bash-sandbox: the upstream stopped answering"
        except h11.RemoteProtocolError:
            failure = "bash-sandbox: the upstream sent a malformed response"
        if not started:
            await _answer(ex.conn, ex.sock, 504 if "stopped" in failure else 502, failure)
        return False


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _answer(conn: h11.Connection, sock: socket.socket, status: int, text: str) -> None:
    """Send a short error response (the caller closes the connection after it); best effort,
    bounded so a client that never reads cannot hold the proxy."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    response, body = _error_response(status, printable(text, 300))
    try:
        data = conn.send(response) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError:
        return
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(_ANSWER_TIMEOUT_S):
            await loop.sock_sendall(sock, data)
        # Lingering close: closing with the client's bytes unread sends a reset, which can
        # destroy the answer before the client reads it. Half-close, then drain a bounded
        # amount for a bounded time.
        sock.shutdown(socket.SHUT_WR)
        drained = 0
        async with asyncio.timeout(_LINGER_S):
            while drained < _LINGER_BYTES and (chunk := await loop.sock_recv(sock, _RECV_BYTES)):
                drained += len(chunk)


async def _connect_any(addresses: tuple[IPAddress, ...], port: int) -> socket.socket:
    """Connect to the first address that answers: only these addresses, never a name."""
    loop = asyncio.get_running_loop()
    last: OSError = OSError("no address")
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM)
        try:
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(upstream, (str(address), port))
        except OSError as exc:
            upstream.close()
            last = exc
            continue
        except BaseException:
            upstream.close()
            raise
        return upstream
    raise last
