"""The TLS-terminating path of the egress proxy, for credential domains only.

After the proxy admitted ``CONNECT domain:port``, connected upstream and answered ``200``,
an `InterceptedTunnel` takes both sockets on a thread of its own (blocking sockets with
timeouts, so nothing here can stall the proxy's loop):

1. the client's TLS is terminated with a leaf for ``domain`` from the executor's CA;
2. the upstream's TLS is verified as any client would (the system's roots, or the
   credential's ``upstream_ca_file``, and ``domain`` as the name);
3. each HTTP/1.1 request (h11 both ways) is checked (another domain's placeholder, a target
   or `Host` other than the domain's own, `CONNECT` or `TRACE`: 403 and a denial) and
   forwarded with the domain's placeholders replaced by their secrets in
   its headers; bodies and responses pass unchanged, hop-by-hop headers dropped. An
   ``Expect: 100-continue`` is answered here. Upgrades (WebSocket) are not relayed.

Every domain without a credential stays an opaque tunnel (`tunnel.relay`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable

import h11

from bash_sandbox.egress.admission import EgressDenial, EgressDenialCode
from bash_sandbox.egress.credentials import CredentialVault
from bash_sandbox.egress.http_headers import forwardable
from bash_sandbox.egress.limits import ProxyLimits

_RECV_BYTES = 64 * 1024
# Answered here (`100 Continue`), or routing hints a front may follow to another host than
# the domain (the secret would go along): never relayed on a credential domain's tunnel.
_REQUEST_ONLY = frozenset(
    {b"expect", b"forwarded", b"x-forwarded-host", b"x-forwarded-server", b"x-host",
     b"x-original-url", b"x-rewrite-url", b"x-original-host"}
)  # fmt: skip
# Methods that would carry the injected headers somewhere else (a tunnel from the upstream
# on) or back to the command (an echo of the request).
_REFUSED_METHODS = frozenset({b"CONNECT", b"TRACE"})


class _Stop(Exception):
    """The exchange ends here (a side closed, failed or timed out)."""


def _next_event(conn: h11.Connection, sock: ssl.SSLSocket) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = sock.recv(_RECV_BYTES)
        except (OSError, ssl.SSLError):
            raise _Stop from None
        conn.receive_data(data)


def _send(sock: ssl.SSLSocket, data: bytes | None) -> None:
    if data:
        try:
            sock.sendall(data)
        except (OSError, ssl.SSLError):
            raise _Stop from None


class InterceptedTunnel:
    """One intercepted CONNECT: the client and upstream sockets (connected, blocking)."""

    def __init__(
        self,
        *,
        client: socket.socket,
        upstream: socket.socket,
        domain: str,
        port: int,
        vault: CredentialVault,
        limits: ProxyLimits,
        record: Callable[[EgressDenial], None],
    ) -> None:
        self._client_raw = client
        self._upstream_raw = upstream
        self._domain = domain
        self._port = port
        self._vault = vault
        self._limits = limits
        self._record = record
        self._sockets: list[socket.socket] = [client, upstream]

    def abort(self) -> None:
        """From any thread: end the exchange now (the blocking calls fail at once)."""
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        """Serve until either side closes; never raises for a network or protocol failure."""
        limits = self._limits
        for sock in (self._client_raw, self._upstream_raw):
            sock.setblocking(True)
            sock.settimeout(limits.idle_timeout_s)
        try:
            self._client_raw.settimeout(limits.request_head_timeout_s)
            client = self._vault.authority.server_context(self._domain).wrap_socket(
                self._client_raw, server_side=True
            )
            self._sockets.append(client)
            client.settimeout(limits.idle_timeout_s)
            context = ssl.create_default_context(cafile=self._vault.upstream_ca_file(self._domain))
            context.set_alpn_protocols(["http/1.1"])
            upstream = context.wrap_socket(self._upstream_raw, server_hostname=self._domain)
            self._sockets.append(upstream)
        except (OSError, ssl.SSLError, ValueError):
            return
        with contextlib.suppress(_Stop, h11.ProtocolError):
            self._exchange(client, upstream)

    def close(self) -> None:
        """Close every socket (the TLS ones own the descriptors once wrapped)."""
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _exchange(self, client: ssl.SSLSocket, upstream: ssl.SSLSocket) -> None:
        down = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes)
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=self._limits.max_header_bytes)
        while True:
            request = _next_event(down, client)
            if not isinstance(request, h11.Request):
                return
            foreign = self._vault.foreign_placeholder(self._domain, request.target, request.headers)
            if foreign is not None:
                why = f"carries the placeholder of the credential for {foreign}"
                self._refuse(down, client, EgressDenialCode.CREDENTIAL_ELSEWHERE, why)
                return
            misdirected = self._misdirected(request)
            if misdirected is not None:
                self._refuse(down, client, EgressDenialCode.CREDENTIAL_MISDIRECTED, misdirected)
                return
            headers = self._vault.inject(
                self._domain, forwardable(request.headers, drop=_REQUEST_ONLY)
            )
            if down.they_are_waiting_for_100_continue:
                _send(client, down.send(h11.InformationalResponse(status_code=100, headers=[])))
            _send(
                upstream,
                up.send(h11.Request(method=request.method, target=request.target, headers=headers)),
            )
            while True:  # the request body, unchanged
                event = _next_event(down, client)
                if isinstance(event, h11.Data):
                    _send(upstream, up.send(h11.Data(data=event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    _send(upstream, up.send(h11.EndOfMessage()))
                    break
                else:
                    return
            while True:  # the response, unchanged but for hop-by-hop headers
                event = _next_event(up, upstream)
                if isinstance(event, h11.InformationalResponse):
                    if event.status_code not in (100, 101):
                        info = h11.InformationalResponse(
                            status_code=event.status_code, headers=forwardable(event.headers)
                        )
                        _send(client, down.send(info))
                    continue
                if isinstance(event, h11.Response):
                    response = h11.Response(
                        status_code=event.status_code,
                        headers=forwardable(event.headers),
                        reason=event.reason,
                    )
                    _send(client, down.send(response))
                elif isinstance(event, h11.Data):
                    _send(client, down.send(h11.Data(data=event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    _send(client, down.send(h11.EndOfMessage()))
                    break
                else:
                    return
            if up.our_state is not h11.DONE or up.their_state is not h11.DONE:
                return  # the upstream closes after this response: so does the tunnel
            if down.our_state is not h11.DONE or down.their_state is not h11.DONE:
                return
            up.start_next_cycle()
            down.start_next_cycle()

    def _misdirected(self, request: h11.Request) -> str | None:
        """Why ``request`` could take the domain's secret to another party, if it could.

        The certificate proves only who terminates the TLS: a shared front (an ingress, a
        PaaS edge, a CDN) routes by the `Host` header or an absolute target, so the secret
        would reach whichever tenant the command named (a red team's front delivered it).
        Only origin-form requests for the domain itself are relayed."""
        if request.method in _REFUSED_METHODS:
            return f"is a {request.method.decode()} request, never relayed with a credential"
        target = request.target
        origin_form = target.startswith(b"/") and not target.startswith(b"//")
        if not (origin_form or (target == b"*" and request.method == b"OPTIONS")):
            return "names another target than the domain's own paths (absolute form)"
        hosts = [v for k, v in request.headers if k == b"host"]
        allowed = {self._domain.encode(), f"{self._domain}:{self._port}".encode()}
        if len(hosts) != 1 or hosts[0].lower().rstrip(b".") not in allowed:
            shown = b", ".join(hosts).decode("ascii", "replace")
            return f"names another host ({shown!r}) than the credential's domain"
        return None

    def _refuse(
        self, down: h11.Connection, client: ssl.SSLSocket, code: EgressDenialCode, reason: str
    ) -> None:
        denial = EgressDenial(host=self._domain, port=self._port, code=code, reason=reason)
        self._record(denial)
        message = denial.message()
        body = (message + "\n").encode("ascii", "replace")
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        with contextlib.suppress(_Stop, h11.LocalProtocolError):
            _send(client, down.send(h11.Response(status_code=403, headers=headers)))
            _send(client, down.send(h11.Data(data=body)))
            _send(client, down.send(h11.EndOfMessage()))
