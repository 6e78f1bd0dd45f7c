"""Row 19: leave a set-id file or a file capability in a writable root for later.

Judged from the host after the run: no file under the workspace may carry S_ISUID or
S_ISGID, nor a `security.capability` xattr, whatever the command printed.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from typing import Any

from bash_sandbox_audit.attacks.common import attack, control
from bash_sandbox_audit.checks import no_escape_lines
from bash_sandbox_audit.model import AttackEnv, AttackSetup, Outcome
from policies import SandboxMode

WRITE = frozenset({SandboxMode.WORKSPACE_WRITE})
_SETID = stat.S_ISUID | stat.S_ISGID
_OUT = "audit-setid"


def left_for_later(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """Every file under the workspace the host now sees with a set-id bit or a capability."""
    found: list[str] = []
    for top, dirs, files in os.walk(env.ws):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if mode & _SETID and not stat.S_ISDIR(mode):
                found.append(f"{path} has mode {oct(mode)}")
            try:
                os.getxattr(path, "security.capability", follow_symlinks=False)
                found.append(f"{path} carries security.capability")
            except OSError as exc:
                if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
                    raise
    return found


def _payloads(env: AttackEnv) -> dict[str, Any]:
    """An archive whose member is 4755, and a setuid binary of the host to copy."""
    out = os.path.join(env.ws, _OUT)
    os.makedirs(out, exist_ok=True)
    archive = os.path.join(out, "setid.tar")
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("from-tar")
        info.mode = 0o4755
        payload = b"#!/bin/sh\nid\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    setuid = next(
        (p for p in ("/usr/bin/su", "/usr/bin/passwd", "/bin/su") if os.path.exists(p)), ""
    )
    # The workspace is the audit's own directory: removed with it.
    return {"setuid": setuid or "/usr/bin/id"}


ATTACKS = [
    attack(
        "row19-setid-files",
        19,
        "leave a set-id file: chmod 4755/2755/u+s, install -m 4755, cp -p of a setuid "
        "binary, tar -xp of a 4755 member",
        f"cd {{{{ws}}}}/{_OUT} && cp /usr/bin/id a && chmod 4755 a; cp /usr/bin/id b && "
        "chmod 2755 b; cp /usr/bin/id c && chmod u+s,g+s c; install -m 4755 /usr/bin/id d; "
        "cp -p {{setuid}} e; tar -xpf setid.tar; ls -l",
        left_for_later,
        modes=WRITE,
        extra=_payloads,
    ),
    attack(
        "row19-setid-syscalls",
        19,
        "create a set-id file directly: open/openat O_CREAT, O_TMPFILE then link, mknod, "
        "fchmod, fchmodat",
        f"""
os.chdir("{{{{ws}}}}/{_OUT}")
attempt("open O_CREAT 04755", lambda: os.open("o", os.O_CREAT | os.O_WRONLY, 0o4755))
def tmpfile():
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o2755)
    os.link(f"/proc/self/fd/{{fd}}", "t", follow_symlinks=True)
    return fd
attempt("O_TMPFILE 02755 + link", tmpfile)
attempt("mknod S_IFREG|04755", lambda: os.mknod("n", 0o100000 | 0o4755))
def fchmod():
    fd = os.open("f", os.O_CREAT | os.O_WRONLY, 0o755)
    os.fchmod(fd, 0o6755)
    return fd
attempt("fchmod 06755", fchmod)
attempt("fchmodat 04755", lambda: os.chmod("f", 0o4755))
""",
        no_escape_lines,
        left_for_later,
        python=True,
        modes=WRITE,
        extra=_payloads,
    ),
    attack(
        "row19-file-capabilities",
        19,
        "leave a file capability: setxattr/fsetxattr security.capability (cap_setuid+ep)",
        f"""
os.chdir("{{{{ws}}}}/{_OUT}")
with open("capped", "wb") as fh:
    fh.write(open("/usr/bin/id", "rb").read())
os.chmod("capped", 0o755)
cap = struct.pack("<IIIII", 0x02000001, 1 << 7, 0, 0, 0)
attempt("setxattr security.capability", lambda: os.setxattr("capped", "security.capability", cap))
def by_fd():
    fd = os.open("capped", os.O_RDONLY)
    os.setxattr(fd, "security.capability", cap)
    return fd
attempt("fsetxattr security.capability", by_fd)
""",
        no_escape_lines,
        left_for_later,
        python=True,
        modes=WRITE,
        extra=_payloads,
    ),
]

CONTROLS = [
    control(
        "row19-control-modes",
        "ordinary modes keep working: chmod +x, chmod 755, cp -p, tar -xp, install -m 0755",
        f"cd {{{{ws}}}}/{_OUT} && echo 'echo ran' > s.sh && chmod +x s.sh && ./s.sh && "
        "chmod 755 s.sh && cp -p s.sh copy.sh && tar -cf plain.tar s.sh && mkdir x && "
        "tar -xpf plain.tar -C x && install -m 0755 s.sh inst.sh && "
        "[ -x x/s.sh ] && [ -x copy.sh ] && [ -x inst.sh ] && echo MODES-OK",
        "ran",
        "MODES-OK",
        modes=WRITE,
        extra=_payloads,
        row=19,
    ),
]
