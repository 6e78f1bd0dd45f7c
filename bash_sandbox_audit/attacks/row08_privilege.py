"""Row 8: keep or regain privilege (capabilities, setuid, user namespaces)."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import time
from typing import Any

from bash_sandbox_audit.attacks.common import (
    attack,
    cleanup_paths,
    py,
)
from bash_sandbox_audit.checks import (
    host_paths_absent,
    no_escape_lines,
    output_lacks,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)

# -- row 8: privilege -----------------------------------------------------------------------


def _identity_targets(env: AttackEnv) -> dict[str, Any]:
    """A user and a group the executor is not, so reaching them is a real gain."""
    import grp
    import pwd

    if not (shutil.which("su") and shutil.which("newgrp")):
        return {"skip": "su or newgrp not installed"}
    try:
        user = next(u for u in ("nobody", "daemon") if pwd.getpwnam(u).pw_uid != os.geteuid())
        group = next(g for g in ("nogroup", "daemon") if grp.getgrnam(g).gr_gid != os.getegid())
        return {
            "su_user": user,
            "su_uid": pwd.getpwnam(user).pw_uid,
            "ng_group": group,
            "ng_gid": grp.getgrnam(group).gr_gid,
        }
    except (KeyError, StopIteration):
        return {"skip": "no second user and group to switch to"}


def gained_identity(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = outcome.all_output()
    needles = (f"SU-UID={setup.data['su_uid']}", f"NEWGRP-GID={setup.data['ng_gid']}")
    return [f"output contains {n!r}" for n in needles if n in text]


def caps_dropped(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """Every status dump printed (one per freshly exec'd program) shows no capabilities and
    no_new_privs set: exec as uid 0 regained nothing."""
    found = []
    for line in outcome.all_output().splitlines():
        key, _, value = line.partition(":")
        key, value = (key.split() or [""])[-1], value.strip()
        if key in ("CapEff", "CapPrm", "CapAmb") and value and int(value, 16) != 0:
            found.append(f"{key} is {value}")
        if key == "NoNewPrivs" and value != "1":
            found.append(f"NoNewPrivs is {value}")
    return found


def capsh_empty(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    for line in outcome.stdout.splitlines():
        if line.startswith("Current:") and line.strip() != "Current: =":
            return [f"capsh reports {line.strip()}"]
    return []


def _setuid_copy(env: AttackEnv) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skip": "making a setuid binary owned by another user needs root"}
    source = shutil.which("id")
    if source is None:
        return {"skip": "no `id` binary to copy"}
    target = os.path.join(env.host, "suid-id")
    shutil.copy(source, target)
    os.chown(target, 65534, 65534)
    os.chmod(target, 0o6755)  # noqa: S103 - the point: setuid+setgid to another user
    return {}


def _runs(binary: str) -> bool:
    """Whether a fresh copy runs; ETXTBSY is retried, bounded.

    Other cells fork concurrently: a child forked while the copy was open for writing holds
    that descriptor until it execs, and the kernel refuses to exec a file open for writing.
    """
    for _ in range(50):
        try:
            done = subprocess.run(
                [binary, "-c", "pass"], capture_output=True, check=False, timeout=20
            )
        except OSError as error:
            if error.errno != errno.ETXTBSY:
                raise
            time.sleep(0.02)
            continue
        return done.returncode == 0
    return False


def _file_caps_copy(env: AttackEnv) -> dict[str, Any]:
    """A copy of python carrying file capabilities (CAP_SETUID, CAP_DAC_OVERRIDE; +ep)."""
    if os.geteuid() != 0:
        return {"skip": "setting file capabilities needs root"}
    target = os.path.join(env.host, "cap-python")
    for source in ("/usr/bin/python3", env.python or ""):
        if not source or not os.path.exists(source):
            continue
        shutil.copy(os.path.realpath(source), target)
        if _runs(target):
            break
    else:
        return {"skip": "no python binary that still runs when copied"}
    caps = (1 << 7) | (1 << 1)  # VFS_CAP_REVISION_2 | effective; permitted = the two caps
    os.setxattr(target, "security.capability", struct.pack("<IIIII", 0x02000001, caps, 0, 0, 0))
    return {}


ATTACKS: list[Attack] = [
    attack(
        "row8-capability-sets",
        8,
        "CapEff/CapPrm/CapAmb are 0 and NoNewPrivs is 1 (read by freshly exec'd programs)",
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; "
        "{{py}} -c 'print(open(\"/proc/self/status\").read())' | "
        "grep -E '^(CapEff|CapPrm|NoNewPrivs):'",
        caps_dropped,
        markers=("AUDIT-BEGIN", "CapEff:", "NoNewPrivs:"),
    ),
    attack(
        "row8-capsh",
        8,
        "capsh --print shows an empty set",
        "capsh --print",
        capsh_empty,
        markers=("AUDIT-BEGIN", "Current:"),
        extra=lambda env: {} if shutil.which("capsh") else {"skip": "capsh not installed"},
    ),
    attack(
        "row8-setuid-binary",
        8,
        "run a setuid/setgid binary owned by another user",
        "{{host}}/suid-id; {{host}}/suid-id -u",
        output_lacks("euid=", "egid="),
        markers=("AUDIT-BEGIN", "uid="),
        extra=_setuid_copy,
    ),
    attack(
        "row8-file-capabilities",
        8,
        "run a binary carrying file capabilities (cap_setuid,cap_dac_override+ep)",
        r"""{{host}}/cap-python - <<'PY'
import errno
import os
for line in open("/proc/self/status"):
    if line.startswith(("CapEff", "CapPrm", "NoNewPrivs")):
        print("FILECAP", line.strip())
try:
    os.setuid(4242)
    print("ESCAPE setuid(4242) via file capabilities")
except OSError as exc:
    print("denied setuid:", exc)
PY
echo "exec status $?"
""",
        caps_dropped,
        no_escape_lines,
        extra=_file_caps_copy,
    ),
    attack(
        "row8-setuid-syscalls",
        8,
        "setuid, setgid, setgroups, setresuid to another id",
        """
attempt("setuid(4242)", lambda: os.setuid(4242))
attempt("setgid(4242)", lambda: os.setgid(4242))
attempt("setgroups([4242])", lambda: os.setgroups([4242]))
attempt("setresuid(4242, 4242, 4242)", lambda: os.setresuid(4242, 4242, 4242))
""",
        no_escape_lines,
        python=True,
    ),
    attack(
        "row8-su-newgrp",
        8,
        "switch identity with setuid tools (su to another user, newgrp to another group)",
        "su -s /bin/sh -c 'echo SU-UID=$(id -u)' {{su_user}}; "
        "echo 'echo NEWGRP-GID=$(id -g)' | newgrp {{ng_group}}",
        gained_identity,
        extra=_identity_targets,
    ),
    attack(
        "row8-new-user-namespace",
        8,
        "a new user namespace to regain capabilities (unshare -U/-r, unshare(2), clone(2))",
        "unshare -U true && echo 'ESCAPE unshare -U'; unshare -r id -u && "
        "echo 'ESCAPE unshare -r'\n"
        + py("""
attempt("unshare(CLONE_NEWUSER)", lambda: sys_call("unshare", 0x10000000))
def clone_userns():
    pid = sys_call("clone", 0x10000000 | 17, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
attempt("clone(CLONE_NEWUSER)", clone_userns)
"""),
        no_escape_lines,
        markers=("AUDIT-BEGIN", "PY-BEGIN"),
    ),
    attack(
        "row8-other-namespaces",
        8,
        "new mount, net, pid, ipc, uts, cgroup, time namespaces (need CAP_SYS_ADMIN)",
        "for f in -m -n -i -u -C -T; do unshare $f true 2>/dev/null && "
        'echo "ESCAPE unshare $f"; done; unshare -p -f true 2>/dev/null && '
        "echo 'ESCAPE unshare -p'",
        no_escape_lines,
    ),
    attack(
        "row8-capability-operations",
        8,
        "operations that need a capability: chroot, "
        "port 80, raw socket, negative nice, /proc/kcore, mknod, chown to another uid",
        """
attempt("chroot (CAP_SYS_CHROOT)", lambda: os.chroot("/"))
def low_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 80))
    s.close()
    return "bound"
attempt("bind port 80 (CAP_NET_BIND_SERVICE)", low_port)
def raw():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    return "opened"
attempt("raw socket (CAP_NET_RAW)", raw)
attempt("nice -5 (CAP_SYS_NICE)", lambda: os.setpriority(os.PRIO_PROCESS, 0, -5))
def kcore():
    with open("/proc/kcore", "rb") as fh:
        return len(fh.read(1))
attempt("read /proc/kcore (CAP_SYS_RAWIO)", kcore)
attempt("mknod a char device (CAP_MKNOD)",
        lambda: os.mknod("{{ws}}/audit-null", 0o600 | 0o020000, os.makedev(1, 3)))
attempt("chown to another uid (CAP_CHOWN)", lambda: os.chown("{{ws}}/notes.txt", 4242, 4242))
""",
        no_escape_lines,
        host_paths_absent("nodes"),
        python=True,
        extra=lambda env: cleanup_paths(env, "nodes", [os.path.join(env.ws, "audit-null")]),
    ),
]
