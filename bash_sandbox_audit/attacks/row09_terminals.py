"""Row 9: terminals: no controlling tty, no TIOCSTI, no host terminal."""

from __future__ import annotations

import os
import termios
import tty
from typing import Any

from bash_sandbox_audit.attacks.common import (
    attack,
)
from bash_sandbox_audit.checks import (
    no_escape_lines,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)

# -- row 9: terminals ------------------------------------------------------------------------


def _audit_pty(env: AttackEnv, *, typed: bool) -> dict[str, Any]:
    """A pseudo-terminal the audit owns, in raw mode; ``typed`` queues input as if a user
    typed a secret into it."""
    master, slave = os.openpty()
    env.cleanup.add(lambda: os.close(master))
    env.cleanup.add(lambda: os.close(slave))
    tty.setraw(slave, termios.TCSANOW)
    os.set_blocking(master, False)
    os.set_blocking(slave, False)
    values: dict[str, Any] = {"pty": os.ttyname(slave), "pty_fds": (master, slave)}
    if typed:
        text = f"AUDIT-TYPED-{env.token}"
        os.write(master, text.encode() + b"\n")
        values["typed"] = text
    return values


def _drain(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except (BlockingIOError, OSError):
        return b""


def pty_untouched(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    master, slave = setup.data["pty_fds"]
    typed: str | None = setup.data.get("typed")
    found = []
    if typed and typed in outcome.all_output():
        found.append("input typed into the audit's terminal was read by the command")
    pending = _drain(slave)
    if typed:
        if typed.encode() not in pending:
            found.append("input typed into the audit's terminal was consumed")
        pending = pending.replace(typed.encode() + b"\n", b"")
    if pending:
        found.append(f"input injected into the audit's terminal: {pending[:40]!r}")
    written = _drain(master)
    if written:
        found.append(f"output written to the audit's terminal: {written[:40]!r}")
    return found


def no_controlling_tty(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    for line in outcome.stdout.splitlines():
        if line.startswith("TTY_NR ") and line.split()[1] != "0":
            return [f"the command has a controlling terminal (tty_nr {line.split()[1]})"]
    return []


ATTACKS: list[Attack] = [
    attack(
        "row9-controlling-tty",
        9,
        "no controlling terminal; open /dev/tty; TIOCSTI on fds 0-2",
        """
fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
print("TTY_NR", fields[4])
attempt("open /dev/tty", lambda: os.close(os.open("/dev/tty", os.O_RDWR)))
for fd in (0, 1, 2):
    attempt("TIOCSTI on fd %d" % fd, lambda: fcntl.ioctl(fd, termios.TIOCSTI, b"#"))
""",
        no_controlling_tty,
        no_escape_lines,
        python=True,
        markers=("AUDIT-BEGIN", "TTY_NR"),
    ),
    attack(
        "row9-inject-terminal",
        9,
        "TIOCSTI keystrokes into a terminal the audit owns",
        r"""
fd = None
for flags in (os.O_RDWR, os.O_RDONLY):
    try:
        fd = os.open("{{pty}}", flags | os.O_NOCTTY)
        break
    except OSError as exc:
        print("denied open the audit's terminal:", exc)
if fd is not None:
    def inject():
        for ch in b"echo INJECTED\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        return "injected"
    attempt("TIOCSTI into the audit's terminal", inject)
""",
        pty_untouched,
        no_escape_lines,
        python=True,
        extra=lambda env: _audit_pty(env, typed=False),
    ),
    attack(
        "row9-read-terminal",
        9,
        "read keystrokes typed into a terminal the audit owns",
        """
try:
    fd = os.open("{{pty}}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
except OSError as exc:
    print("denied open the audit's terminal:", exc)
else:
    time.sleep(0.05)
    try:
        print("READ", os.read(fd, 256))
    except OSError as exc:
        print("denied read:", exc)
""",
        pty_untouched,
        no_escape_lines,
        python=True,
        extra=lambda env: _audit_pty(env, typed=True),
    ),
    attack(
        "row9-write-terminal",
        9,
        "write into a terminal the audit owns",
        r"""
attempt("write to the audit's terminal", lambda: os.write(
    os.open("{{pty}}", os.O_WRONLY | os.O_NOCTTY), b"AUDIT-WRITTEN\n"))
""",
        pty_untouched,
        no_escape_lines,
        python=True,
        extra=lambda env: _audit_pty(env, typed=False),
    ),
]
