"""Row 10: reach a host service by a socket route."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from typing import Any

from bash_sandbox_audit import scenarios
from bash_sandbox_audit.attacks.common import (
    BEGIN,
    Render,
    attack,
    control,
    py,
    scenario,
)
from bash_sandbox_audit.checks import (
    no_escape_lines,
    servers_silent,
    verify_control,
)
from bash_sandbox_audit.model import (
    BOTH_MODES,
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)
from bash_sandbox_audit.targets import (
    CountingServer,
    remove_path,
    start_server,
)
from policies import SandboxMode

# -- row 10: the isolated network ------------------------------------------------------------

NET = r"""
def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect((host, port))
    s.sendall(b"audit")
    s.close()
    return "connected"
"""


def _servers(*kinds: str) -> Callable[[AttackEnv], dict[str, Any]]:
    def make(env: AttackEnv) -> dict[str, Any]:
        values: dict[str, Any] = {"servers": []}
        for kind in kinds:
            try:
                server = _start(env, kind, values)
            except OSError as exc:
                return {"skip": f"cannot bind the {kind} server here: {exc.strerror}"}
            values["servers"].append(server)
        return values

    return make


def _start(env: AttackEnv, kind: str, values: dict[str, Any]) -> CountingServer:
    af, st = socket.AF_INET, socket.SOCK_STREAM
    if kind == "tcp4":
        server = start_server(af, st, ("127.0.0.1", 0), "tcp 127.0.0.1", env.cleanup)
        values["tcp_port"] = server.sock.getsockname()[1]
    elif kind == "udp4":
        server = start_server(af, socket.SOCK_DGRAM, ("127.0.0.1", 0), "udp 127.0.0.1", env.cleanup)
        values["udp_port"] = server.sock.getsockname()[1]
    elif kind == "tcp6":
        server = start_server(socket.AF_INET6, st, ("::1", 0), "tcp [::1]", env.cleanup)
        values["tcp6_port"] = server.sock.getsockname()[1]
    elif kind == "abstract":
        server = start_server(
            socket.AF_UNIX, st, f"\0bash-sandbox-audit-{env.token}", "abstract unix", env.cleanup
        )
    else:
        dgram = kind == "unix-dgram"
        path = os.path.join(env.sock_dir, f"{env.token[:10]}{'d' if dgram else 's'}.sock")
        server = start_server(
            socket.AF_UNIX,
            socket.SOCK_DGRAM if dgram else st,
            path,
            f"unix {'datagram' if dgram else 'stream'} {path}",
            env.cleanup,
        )
        env.cleanup.add(functools.partial(remove_path, path))
        values["unix_dgram" if dgram else "unix_stream"] = path
    return server


def net_attack(id: str, title: str, body: str, *kinds: str, bash: str = "") -> Attack:
    return attack(
        id,
        10,
        title,
        bash + py(NET + body),
        servers_silent,
        no_escape_lines,
        extra=_servers(*kinds),
        markers=("AUDIT-BEGIN", "PY-BEGIN"),
    )


def only_loopback(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    found = []
    for line in outcome.stdout.splitlines():
        if line.startswith("IFACES ") and set(line.split()[1].split(",")) - {"lo"}:
            found.append(f"interfaces besides lo: {line.split()[1]}")
        if line.startswith("ROUTES ") and line.split()[1] != "0":
            found.append(f"{line.split()[1]} IPv4 route(s) out")
    return found


ATTACKS: list[Attack] = [
    net_attack(
        "row10-tcp-loopback",
        "connect to a TCP server on the host's 127.0.0.1 (python, bash /dev/tcp, curl)",
        'attempt("tcp 127.0.0.1", lambda: tcp("127.0.0.1", {{tcp_port}}))',
        "tcp4",
        bash="(exec 3<>/dev/tcp/127.0.0.1/{{tcp_port}}) 2>&1; command -v curl >/dev/null"
        " && curl -sS --max-time 3 -o /dev/null http://127.0.0.1:{{tcp_port}}/ 2>&1\n",
    ),
    net_attack(
        "row10-udp-loopback",
        "send datagrams to a UDP server on the host's 127.0.0.1",
        """
# sendto succeeds whether or not anything listens: only the host's server can tell.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    try:
        s.sendto(b"audit", ("127.0.0.1", {{udp_port}}))
        print("udp datagram sent (judged by the host's server)")
    except OSError as exc:
        print("denied udp sendto:", exc)
""",
        "udp4",
    ),
    net_attack(
        "row10-tcp-ipv6-loopback",
        "connect to a TCP server on the host's ::1",
        'attempt("tcp [::1]", lambda: tcp("::1", {{tcp6_port}}, socket.AF_INET6))',
        "tcp6",
    ),
    net_attack(
        "row10-ipv4-mapped",
        "reach the host's 127.0.0.1 as ::ffff:127.0.0.1",
        'attempt("tcp [::ffff:127.0.0.1]", '
        'lambda: tcp("::ffff:127.0.0.1", {{tcp_port}}, socket.AF_INET6))',
        "tcp4",
    ),
    net_attack(
        "row10-abstract-unix",
        "connect to the host's abstract unix socket",
        r"""
def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0bash-sandbox-audit-{{token}}")
    return "connected"
attempt("abstract unix socket", abstract)
""",
        "abstract",
    ),
    net_attack(
        "row10-pathname-unix",
        "connect to a host unix socket outside the roots",
        """
def stream():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("{{unix_stream}}")
    return "connected"
attempt("pathname unix stream socket", stream)
""",
        "unix",
    ),
    net_attack(
        "row10-pathname-unix-dgram",
        "send to a host unix datagram socket outside the roots",
        """
def dgram():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    return s.sendto(b"audit", "{{unix_dgram}}")
attempt("pathname unix datagram socket", dgram)
""",
        "unix-dgram",
    ),
    attack(
        "row10-no-way-out",
        10,
        "the namespace has only lo and no route out",
        """
lines = open("/proc/net/dev").read().splitlines()[2:]
print("IFACES", ",".join(l.split(":")[0].strip() for l in lines))
print("ROUTES", len(open("/proc/net/route").read().splitlines()[1:]))
""",
        only_loopback,
        python=True,
        markers=("AUDIT-BEGIN", "IFACES"),
    ),
]


# -- host unix sockets by every route, under both networks -----------------------------------

# route -> the server's socket type; each route has a server of its own, so a hit names it.
UNIX_ROUTES: dict[str, socket.SocketKind] = {
    "stream-connect": socket.SOCK_STREAM,
    "seqpacket-connect": socket.SOCK_SEQPACKET,
    "dgram-sendto": socket.SOCK_DGRAM,
    "dgram-connect-send": socket.SOCK_DGRAM,
    "dgram-sendmsg": socket.SOCK_DGRAM,
    "socketpair-sendto": socket.SOCK_DGRAM,
    "socketpair-sendmsg": socket.SOCK_DGRAM,
    "raw-sendto": socket.SOCK_DGRAM,  # AF_UNIX SOCK_RAW is a datagram socket to the kernel
}

UNIX_EVERY_ROUTE = r"""
U = socket.AF_UNIX
def stream():
    s = socket.socket(U, socket.SOCK_STREAM)
    s.connect("{{sock_stream_connect}}")
    return "connected"
def seqpacket():
    s = socket.socket(U, socket.SOCK_SEQPACKET)
    s.connect("{{sock_seqpacket_connect}}")
    return s.send(b"audit")
def dgram_sendto():
    return socket.socket(U, socket.SOCK_DGRAM).sendto(b"audit", "{{sock_dgram_sendto}}")
def dgram_connect_send():
    s = socket.socket(U, socket.SOCK_DGRAM)
    s.connect("{{sock_dgram_connect_send}}")
    return s.send(b"audit")
def dgram_sendmsg():
    return socket.socket(U, socket.SOCK_DGRAM).sendmsg([b"audit"], [], 0,
                                                        "{{sock_dgram_sendmsg}}")
def pair_sendto():
    a, b = socket.socketpair(U, socket.SOCK_DGRAM)
    return a.sendto(b"audit", "{{sock_socketpair_sendto}}")
def pair_sendmsg():
    a, b = socket.socketpair(U, socket.SOCK_DGRAM)
    return a.sendmsg([b"audit"], [], 0, "{{sock_socketpair_sendmsg}}")
def raw_sendto():
    return socket.socket(U, socket.SOCK_RAW).sendto(b"audit", "{{sock_raw_sendto}}")
for name, fn in (("socket+connect stream", stream), ("socket+connect seqpacket", seqpacket),
                 ("socket+sendto dgram", dgram_sendto), ("connect+send dgram", dgram_connect_send),
                 ("sendmsg msg_name dgram", dgram_sendmsg),
                 ("socketpair(SOCK_DGRAM)+sendto", pair_sendto),
                 ("socketpair(SOCK_DGRAM)+sendmsg msg_name", pair_sendmsg),
                 ("socket(AF_UNIX, SOCK_RAW)+sendto", raw_sendto)):
    attempt(name, fn)
"""


def _route_servers(env: AttackEnv) -> dict[str, Any]:
    """One host unix server per route, in the audit's own directory (outside every root)."""
    values: dict[str, Any] = {"servers": []}
    for n, (route, kind) in enumerate(UNIX_ROUTES.items()):
        path = os.path.join(env.sock_dir, f"{env.token[:10]}r{n}.sock")
        try:
            server = start_server(socket.AF_UNIX, kind, path, f"unix {route}", env.cleanup)
        except OSError as exc:
            return {"skip": f"cannot bind the {route} server here: {exc.strerror}"}
        env.cleanup.add(functools.partial(remove_path, path))
        values["servers"].append(server)
        values["sock_" + route.replace("-", "_")] = path
    return values


SOCKET_FAMILIES = r"""
# (family number, type, protocol): none may even be created.
for name, family, kind, proto in (("AF_VSOCK", 40, socket.SOCK_STREAM, 0),
                                  ("AF_PACKET", 17, socket.SOCK_RAW, 0x0300),
                                  ("AF_ALG", 38, socket.SOCK_SEQPACKET, 0),
                                  ("AF_XDP", 44, socket.SOCK_RAW, 0),
                                  ("AF_KEY", 15, socket.SOCK_RAW, 2)):
    def make():
        socket.socket(family, kind, proto).close()
        return "created"
    attempt("socket(%s)" % name, make)
"""

HOST_NETWORK = {"network": "host"}


def _unix_routes(id: str, title: str, kwargs: dict[str, Any] | None) -> Attack:
    return attack(
        id,
        10,
        title,
        UNIX_EVERY_ROUTE,
        servers_silent,
        python=True,
        extra=_route_servers,
        kwargs=kwargs,
    )


def _families(id: str, title: str, kwargs: dict[str, Any] | None) -> Attack:
    return attack(id, 10, title, SOCKET_FAMILIES, no_escape_lines, python=True, kwargs=kwargs)


ATTACKS += [
    _unix_routes(
        "row10-unix-every-route-isolated",
        "host unix sockets outside the roots by every route (connect, sendto, sendmsg, "
        "socketpair, SOCK_RAW; stream, dgram, seqpacket) under network=isolated",
        None,
    ),
    _unix_routes(
        "row10-unix-every-route-host-network",
        "the same routes under network=host",
        HOST_NETWORK,
    ),
    _families(
        "row10-socket-families-isolated",
        "create AF_VSOCK, AF_PACKET, AF_ALG, AF_XDP, AF_KEY sockets under network=isolated",
        None,
    ),
    _families(
        "row10-socket-families-host-network",
        "create the same socket families under network=host",
        HOST_NETWORK,
    ),
    attack(
        "row10-abstract-unix-host-network",
        10,
        "connect to the host's abstract unix socket under network=host",
        r"""
def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0bash-sandbox-audit-{{token}}")
    return "connected"
attempt("abstract unix socket", abstract)
""",
        servers_silent,
        python=True,
        extra=_servers("abstract"),
        kwargs=HOST_NETWORK,
    ),
]


# -- positive controls: the command's own sockets -------------------------------------------

# A server the command starts itself: it reaches itself, prints SERVING, and keeps serving
# so a later run() of the same executor can reach it too.
OWN_SERVER = """{{py}} - <<'PY'
import socket, threading
tcp = "{{kind}}" == "tcp"
addr = ("127.0.0.1", {{port}}) if tcp else "{{address}}"
srv = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(addr)
srv.listen(8)
def serve():
    while True:
        conn, _ = srv.accept()
        conn.sendall(b"HELLO")
        conn.close()
threading.Thread(target=serve, daemon=True).start()
me = socket.socket(srv.family)
me.connect(addr)
print("SAME-OK" if me.recv(5) == b"HELLO" else "SAME-BAD", flush=True)
print("SERVING", flush=True)
threading.Event().wait()
PY
"""
OWN_CLIENT = """{{py}} - <<'PY'
import socket
tcp = "{{kind}}" == "tcp"
c = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX)
c.connect(("127.0.0.1", {{port}}) if tcp else "{{address}}")
print("LATER-OK" if c.recv(5) == b"HELLO" else "LATER-BAD", flush=True)
PY
"""


def _own_server(kind: str, address: str) -> Callable[[AttackEnv], dict[str, Any]]:
    def extra(env: AttackEnv) -> dict[str, Any]:
        port = 20_000 + int(env.token[-4:], 16) % 30_000
        return {"kind": kind, "address": env.render(address), "port": port}

    return extra


def _client(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {"command": render(BEGIN + OWN_SERVER), "client": render(BEGIN + OWN_CLIENT)}


def own_server_control(
    id: str, title: str, kind: str, address: str, modes: frozenset[SandboxMode]
) -> Attack:
    return scenario(
        id,
        10,
        title,
        _client,
        extra=_own_server(kind, address),
        python=True,
        drive=scenarios.serve_then_connect,
        verify=verify_control("SAME-OK", "LATER-OK"),
        kind="control",
        modes=modes,
    )


CONTROLS: list[Attack] = [
    # Relative: a workspace path would not fit in sun_path (108 bytes); the cwd is the ws.
    own_server_control(
        "row10-control-own-unix-server-workspace",
        "the command's own unix server in the workspace, reached by itself and a later run()",
        "unix",
        "own-{{token}}.sock",
        WORKSPACE_WRITE,
    ),
    own_server_control(
        "row10-control-own-unix-server-tmp",
        "the command's own unix server in /tmp, reached by itself and a later run()",
        "unix",
        "/tmp/own-{{token}}.sock",
        BOTH_MODES,
    ),
    own_server_control(
        "row10-control-own-tcp-server",
        "the command's own loopback TCP server, reached by itself and a later run()",
        "tcp",
        "",
        BOTH_MODES,
    ),
    control(
        "row10-control-socketpair-stream",
        "socketpair(AF_UNIX, SOCK_STREAM) works",
        "{{py}} -c 'import socket; a, b = socket.socketpair(socket.AF_UNIX, "
        'socket.SOCK_STREAM); a.sendall(b"x"); print("PAIR-OK" if b.recv(1) == b"x" else "")\'',
        "PAIR-OK",
        row=10,
    ),
]
