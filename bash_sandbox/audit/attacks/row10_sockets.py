"""Row 10: reach a host service by a socket route."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from typing import Any

from bash_sandbox.audit.attacks.common import (
    attack,
    py,
)
from bash_sandbox.audit.checks import (
    no_escape_lines,
    servers_silent,
)
from bash_sandbox.audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)
from bash_sandbox.audit.targets import (
    CountingServer,
    remove_path,
    start_server,
)

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
