"""The attack catalog: every row of threat-model.md as real attacks, plus positive controls.

One source of truth: `bash-sandbox audit` and tests/security both run `ATTACKS`. Each attack
names its threat-model row, builds its premise under its own directory (`prepare`), and is
judged from outside the sandbox (`verify`): the host tree compared before and after, victim
processes the audit started, servers the audit bound, processes found by the run's token.
A command's own words count only as extra evidence of success ("ESCAPE ..." lines printed
when a forbidden call returned success), never as proof of containment.

Harmless by construction: targets are the audit's own files, processes, sockets and
servers on 127.0.0.1/::1. Device and kernel knobs are only opened for writing (then closed,
nothing written) or written with the value they already hold.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import hashlib
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import termios
import tty
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bash_sandbox.audit import drives
from bash_sandbox.audit.checks import (
    Check,
    guards_unchanged,
    host_paths_absent,
    no_escape_lines,
    output_lacks,
    secrets_kept,
    servers_silent,
    shorten,
    verify_attack,
    verify_control,
    victim_untouched,
    why_contained,
)
from bash_sandbox.audit.layout import (
    PROTECTED_PATHS,
    VICTIM_TEXT,
    Secrets,
    build_layout,
    guard_paths,
    placeholders,
    protected_guards,
    take,
)
from bash_sandbox.audit.model import (
    BOTH_MODES,
    READ_ONLY,
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Drive,
    Finding,
    Outcome,
    Verdict,
    Verify,
    audit_error,
    contained,
    escaped,
)
from bash_sandbox.audit.targets import (
    CountingServer,
    Victim,
    pid_alive,
    proc_field,
    proc_stat_fields,
    remove_path,
    start_server,
    start_victim,
    wait_tagged_gone,
)
from bash_sandbox.errors import SandboxUnavailableError
from policies import SandboxMode

BEGIN = "echo AUDIT-BEGIN\n"

# Prepended to every Python attack. `attempt` prints "ESCAPE <what>" when a forbidden call
# succeeded and "denied <what>: <error>" otherwise; only the first is evidence.
PRELUDE = """\
import ctypes, ctypes.util, errno, fcntl, os, signal, socket, struct, sys, termios, time
print("PY-BEGIN", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ARCH = os.uname().machine
NR = {
    "x86_64": dict(clone=56, ptrace=101, rt_sigqueueinfo=129, tgkill=234, renameat2=316,
                   process_vm_readv=310, process_vm_writev=311, unshare=272),
    "aarch64": dict(clone=220, ptrace=117, rt_sigqueueinfo=138, tgkill=131, renameat2=276,
                    process_vm_readv=270, process_vm_writev=271, unshare=97),
}.get(ARCH, dict())
NR.update(pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438)

def sys_call(name, *args):
    if name not in NR:
        raise OSError(errno.ENOSYS, "no syscall number for %s on %s" % (name, ARCH))
    r = libc.syscall(NR[name], *args)
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r

def attempt(name, fn):
    try:
        result = fn()
    except OSError as exc:
        print("denied %s: %s" % (name, exc), flush=True)
        return None
    print(("ESCAPE %s: %r" % (name, result))[:300], flush=True)
    return result
"""


def py(body: str) -> str:
    """A Python attack as a bash heredoc (quoted: bash expands nothing inside)."""
    return "{{py}} - <<'PY'\n" + PRELUDE + body.strip("\n") + "\nPY\n"


# -- prepare helpers ---------------------------------------------------------------------------


def _template_values(values: dict[str, Any]) -> dict[str, str]:
    """The premise's plain values (ports, pids, paths) usable as ``{{name}}`` in commands."""
    return {k: str(v) for k, v in values.items() if isinstance(v, str | int)}


def _needs_python(env: AttackEnv) -> str | None:
    return None if env.python else "no python3 on this host to run the attack"


def prepare_files(
    template: str,
    *,
    git: str = "repo",
    python: bool = False,
    workspace_guard: bool | None = None,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    protected: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> Callable[[AttackEnv], Awaitable[AttackSetup]]:
    """Standard premise: the layout, guard snapshots, and the rendered command."""

    async def prepare(env: AttackEnv) -> AttackSetup:
        if (python or "{{py}}" in template) and (why := _needs_python(env)):
            return AttackSetup(skip=why)
        secrets = build_layout(env, git=git)
        values: dict[str, Any] = extra(env) if extra is not None else {}
        if "skip" in values:
            return AttackSetup(skip=str(values["skip"]))
        guards = guard_paths(env, workspace=workspace_guard)
        holes: set[str] = set()
        executor_kwargs = dict(kwargs or {})
        if protected:
            guards.update(protected_guards(env.ws))
            executor_kwargs.setdefault("protected_paths", PROTECTED_PATHS)
            holes = placeholders(env.ws)
        guards.update(values.pop("guards", {}))
        executor_kwargs.update(values.pop("executor_kwargs", {}))
        rendered = env.render(BEGIN + template, _template_values(values))
        data: dict[str, Any] = {
            "guards": guards,
            "before": take(guards),
            "secrets": secrets,
            "placeholders": holes,
            **values,
        }
        return AttackSetup(command=rendered, data=data, executor_kwargs=executor_kwargs)

    return prepare


def attack(
    id: str,
    row: int,
    title: str,
    template: str,
    *checks: Check,
    python: bool = False,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    git: str = "repo",
    workspace_guard: bool | None = None,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    protected: bool = False,
    kwargs: dict[str, Any] | None = None,
    drive: Drive = drives.foreground,
    backends: Sequence[str] = ("bwrap", "landlock"),
    markers: Sequence[str] = ("AUDIT-BEGIN",),
) -> Attack:
    """A catalog entry whose premise is the standard layout (plus ``extra``)."""
    body = py(template) if python else template
    return Attack(
        id=id,
        row=row,
        title=title,
        prepare=prepare_files(
            body,
            git=git,
            python=python,
            workspace_guard=workspace_guard,
            extra=extra,
            protected=protected,
            kwargs=kwargs,
        ),
        verify=verify_attack(*checks, markers=markers, python=python),
        drive=drive,
        modes=modes,
        backends=frozenset(backends),
    )


FILES: tuple[Check, ...] = (guards_unchanged, no_escape_lines)


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


def known_limit(entry: Attack, why: str) -> Attack:
    """An attack no path-based sandbox can contain: an escape is reported as not
    enforceable, with ``why`` (documented in docs/threat-model-coverage.md), never hidden."""
    inner = entry.verify

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        finding = await inner(env, setup, outcome)
        if finding.verdict is Verdict.ESCAPED:
            return Finding(Verdict.NOT_ENFORCEABLE, why, finding.evidence)
        return finding

    return dataclasses.replace(entry, verify=verify)


# -- row 1: write outside the writable roots ----------------------------------------------------

ROW1 = [
    attack(
        "row1-overwrite", 1, "overwrite a file outside the roots", "echo pwned > {{victim}}", *FILES
    ),
    attack(
        "row1-append", 1, "append to a file outside the roots", "echo pwned >> {{victim}}", *FILES
    ),
    attack(
        "row1-write-in-place",
        1,
        "write without truncating (dd conv=notrunc)",
        "printf pwned | dd of={{victim}} conv=notrunc status=none",
        *FILES,
    ),
    attack(
        "row1-copy-over",
        1,
        "cp over a file outside the roots",
        "cp /etc/hostname {{victim}}",
        *FILES,
    ),
    attack(
        "row1-sed-in-place",
        1,
        "sed -i (temp file + rename) outside the roots",
        "sed -i s/original/pwned/ {{victim}}",
        *FILES,
    ),
    attack(
        "row1-create",
        1,
        "create a file outside the roots",
        "echo pwned > {{host}}/created.txt",
        *FILES,
    ),
    attack("row1-delete", 1, "delete a file outside the roots", "rm -f {{victim}}", *FILES),
    attack(
        "row1-delete-tree",
        1,
        "rm -rf a directory outside the roots",
        "rm -rf {{host}}/victim-dir",
        *FILES,
    ),
    attack(
        "row1-rename",
        1,
        "rename a file outside the roots",
        "mv {{victim}} {{host}}/renamed.txt",
        *FILES,
    ),
    attack(
        "row1-move-into-workspace",
        1,
        "move a host file into the workspace",
        "mv {{victim}} {{ws}}/stolen.txt",
        *FILES,
    ),
    attack(
        "row1-rename-exchange",
        1,
        "renameat2(RENAME_EXCHANGE) a workspace file with a host file",
        """
AT = -100
attempt("renameat2 RENAME_EXCHANGE", lambda: sys_call(
    "renameat2", AT, b"{{ws}}/notes.txt", AT, b"{{victim}}", 2))
attempt("rename a workspace file over the victim",
        lambda: os.rename("{{ws}}/notes.txt", "{{victim}}"))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row1-chmod",
        1,
        "chmod a file and a directory outside the roots",
        "chmod 0777 {{victim}}; chmod 0700 {{host}}",
        *FILES,
    ),
    attack(
        "row1-chown", 1, "chown a file outside the roots", "chown 65534:65534 {{victim}}", *FILES
    ),
    attack(
        "row1-truncate",
        1,
        "truncate(2) a file outside the roots",
        "truncate -s 0 {{victim}}",
        *FILES,
    ),
    attack(
        "row1-truncate-on-open",
        1,
        "open O_TRUNC a file outside the roots",
        ": > {{victim}}",
        *FILES,
    ),
    attack("row1-mkdir", 1, "mkdir outside the roots", "mkdir {{host}}/newdir", *FILES),
    attack("row1-rmdir", 1, "rmdir outside the roots", "rmdir {{host}}/empty-dir", *FILES),
    attack(
        "row1-symlink",
        1,
        "create a symlink outside the roots",
        "ln -s /etc/hostname {{host}}/link",
        *FILES,
    ),
    attack(
        "row1-hardlink",
        1,
        "create a hardlink outside the roots",
        "ln {{victim}} {{host}}/hardlink",
        *FILES,
    ),
    attack("row1-mkfifo", 1, "create a fifo outside the roots", "mkfifo {{host}}/fifo", *FILES),
    attack(
        "row1-touch-mtime",
        1,
        "touch -d (utimensat by path) outside the roots",
        "touch -d 2000-01-01 {{victim}}; touch -d 2000-01-01 {{host}}/empty-dir",
        *FILES,
    ),
    attack(
        "row1-syscalls",
        1,
        "every write syscall directly (open, creat, truncate, rename, "
        "unlink, mkdir, rmdir, symlink, link, chmod, chown, utime, mknod, setxattr)",
        """
V, H = "{{victim}}", "{{host}}"
attempt("open O_WRONLY", lambda: os.close(os.open(V, os.O_WRONLY)))
attempt("open O_CREAT", lambda: os.close(os.open(H + "/py-created", os.O_WRONLY | os.O_CREAT)))
attempt("truncate", lambda: os.truncate(V, 0))
attempt("rename", lambda: os.rename(V, H + "/py-renamed"))
attempt("unlink", lambda: os.unlink(H + "/victim-dir/inner.txt"))
attempt("mkdir", lambda: os.mkdir(H + "/py-dir"))
attempt("rmdir", lambda: os.rmdir(H + "/empty-dir"))
attempt("symlink", lambda: os.symlink("/etc/hostname", H + "/py-link"))
attempt("link", lambda: os.link(V, H + "/py-hardlink"))
attempt("chmod", lambda: os.chmod(V, 0o777))
attempt("chown", lambda: os.chown(V, 4242, 4242))
attempt("utime", lambda: os.utime(V, (1, 1)))
attempt("mkfifo", lambda: os.mkfifo(H + "/py-fifo"))
attempt("setxattr", lambda: os.setxattr(V, "user.audit", b"x"))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row1-metadata-via-descriptor",
        1,
        "futimens/fchmod/fchown/fsetxattr on a descriptor opened read-only",
        """
fd = os.open("{{victim}}", os.O_RDONLY)
dfd = os.open("{{host}}", os.O_RDONLY | os.O_DIRECTORY)
attempt("futimens on a read-only file descriptor", lambda: os.utime(fd, (1, 1)))
attempt("futimens on a directory descriptor", lambda: os.utime(dfd, (1, 1)))
attempt("fchmod on a read-only descriptor", lambda: os.fchmod(fd, 0o777))
attempt("fchown on a read-only descriptor", lambda: os.fchown(fd, 4242, 4242))
attempt("fsetxattr on a read-only descriptor", lambda: os.setxattr(fd, "user.audit", b"x"))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row1-real-tmp",
        1,
        "write, create and delete in the host's /tmp",
        "echo pwned > {{tmp}}/victim.txt; echo new > {{tmp}}/new.txt; rm -f {{tmp}}/keep.txt",
        *FILES,
    ),
    attack(
        "row1-write-workspace-read-only",
        1,
        "write, create, delete, chmod in the workspace under read-only",
        "echo pwned > {{ws}}/notes.txt; echo new > {{ws}}/new.txt; mkdir {{ws}}/d; "
        "chmod 777 {{ws}}/notes.txt; touch -d 2000-01-01 {{ws}}/notes.txt; "
        "rm -f {{ws}}/notes.txt",
        *FILES,
        modes=READ_ONLY,
    ),
    attack(
        "row1-move-workspace-root",
        1,
        "rename or remove the workspace root itself",
        "mv {{ws}} {{ws}}-moved; rmdir {{ws}}; mv {{ws}}/.. {{root}}-moved",
        *FILES,
        host_paths_absent("moved"),
        extra=lambda env: {
            "moved": [env.ws + "-moved", env.root + "-moved"],
            "guards": {"ws-root": env.ws},
        },
        workspace_guard=False,
    ),
]


# -- row 2: the same through links, `..`, /proc ---------------------------------------------


async def _with_victim(env: AttackEnv, values: dict[str, Any]) -> dict[str, Any]:
    assert env.python is not None
    victim = await start_victim(
        env.python,
        env.observe,
        env.host,
        os.path.join(env.host, "victim.txt"),
        env.cleanup,
        memory=f"AUDIT-MEMORY-{env.token}",
        secret=f"AUDIT-VICTIM-SECRET-{env.token}",
    )
    values.update(
        victim=victim, vpid=victim.pid, vaddr=victim.address, vfd=victim.held_fd, vsize=victim.size
    )
    return values


def victim_attack(
    id: str,
    row: int,
    title: str,
    template: str,
    *checks: Check,
    python: bool = False,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    setup_extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    needs: str | None = None,
) -> Attack:
    """An attack on a victim process the audit starts outside the sandbox."""
    body = BEGIN + (py(template) if python else template)

    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := _needs_python(env):
            return AttackSetup(skip=why)
        if needs is not None and shutil.which(needs) is None:
            return AttackSetup(skip=f"{needs} is not installed here")
        secrets = build_layout(env)
        guards = guard_paths(env)
        values = await _with_victim(env, setup_extra(env) if setup_extra else {})
        rendered = env.render(body, _template_values(values))
        return AttackSetup(
            command=rendered,
            data={"guards": guards, "before": take(guards), "secrets": secrets, **values},
        )

    return Attack(
        id,
        row,
        title,
        prepare,
        verify_attack(*checks, victim_untouched, python=python),
        drives.foreground,
        modes=modes,
    )


ROW2 = [
    attack(
        "row2-symlink-to-file",
        2,
        "write through a planted symlink to a host file",
        "echo pwned > {{ws}}/link-file",
        *FILES,
    ),
    attack(
        "row2-symlink-to-dir",
        2,
        "write, create, delete through a planted symlink to a host directory",
        "echo pwned > {{ws}}/link-dir/victim.txt; touch {{ws}}/link-dir/new.txt; "
        "rm -f {{ws}}/link-dir/victim-dir/inner.txt",
        *FILES,
    ),
    attack(
        "row2-dangling-symlink",
        2,
        "create a host file through a planted dangling symlink",
        "echo pwned > {{ws}}/dangling",
        *FILES,
    ),
    attack(
        "row2-symlink-made-by-command",
        2,
        "plant a symlink to the host, then write through it",
        "ln -s {{host}} {{ws}}/cmd-link && echo pwned > {{ws}}/cmd-link/victim.txt; "
        "ln -sf {{victim}} {{ws}}/cmd-file-link && echo pwned > {{ws}}/cmd-file-link",
        *FILES,
    ),
    known_limit(
        attack(
            "row2-hardlink-planted",
            2,
            "write through a hardlink (to a host file) that already sits in the workspace",
            "echo pwned > {{ws}}/hardlink",
            *FILES,
        ),
        "a hardlink placed in the workspace before the run is a workspace file to every "
        "path-based sandbox; commands cannot make one (row2-hardlink-made-by-command)",
    ),
    attack(
        "row2-hardlink-made-by-command",
        2,
        "hardlink a host file into the workspace, then write it",
        "ln {{victim}} {{ws}}/cmd-hardlink && echo pwned > {{ws}}/cmd-hardlink",
        *FILES,
    ),
    attack(
        "row2-dotdot",
        2,
        "`..` out of the workspace",
        "echo pwned > {{ws}}/../host/victim.txt; cd {{ws}} && "
        "echo pwned > ../host/created-dotdot.txt",
        *FILES,
    ),
    attack(
        "row2-proc-self-cwd",
        2,
        "write via /proc/self/cwd",
        "cd {{host}} && echo pwned > /proc/self/cwd/victim.txt; "
        "cd {{host}} && touch /proc/self/cwd/new.txt",
        *FILES,
    ),
    attack(
        "row2-proc-self-root",
        2,
        "write via /proc/self/root",
        "echo pwned > /proc/self/root{{victim}}",
        *FILES,
    ),
    victim_attack(
        "row2-proc-pid-root",
        2,
        "write via /proc/<pid>/root, cwd and fd of a host process",
        "echo pwned > /proc/{{vpid}}/root{{victim}}; "
        "echo pwned > /proc/{{vpid}}/cwd/victim.txt; "
        "echo pwned > /proc/{{vpid}}/fd/{{vfd}}",
        *FILES,
    ),
    attack(
        "row2-proc-self-fd",
        2,
        "reopen an inherited read-only descriptor for writing via /proc/self/fd/N",
        "exec 3<{{victim}}; echo pwned > /proc/self/fd/3; echo pwned > /dev/fd/3; "
        "exec 4<{{host}}; echo pwned > /proc/self/fd/4/victim.txt",
        *FILES,
    ),
    attack(
        "row2-inherited-descriptors",
        2,
        "descriptors inherited from the executor: reopen each for writing (nothing written)",
        """
for n in sorted(int(x) for x in os.listdir("/proc/self/fd")):
    if n <= 2:
        continue
    try:
        target = os.readlink("/proc/self/fd/%d" % n)
    except OSError:
        continue
    if target.startswith("/proc/") and target.endswith("/fd"):
        continue
    print("INHERITED %d -> %s" % (n, target), flush=True)
    if target.startswith("/") and not target.startswith("{{ws}}"):
        attempt("reopen inherited fd %d (%s) for writing" % (n, target),
                lambda: os.close(os.open("/proc/self/fd/%d" % n, os.O_WRONLY | os.O_APPEND)))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row2-openat-dirfd",
        2,
        "openat() relative to a host directory descriptor; reopen an O_PATH descriptor",
        """
d = os.open("{{host}}", os.O_RDONLY | os.O_DIRECTORY)
attempt("openat(dirfd, victim, O_WRONLY)",
        lambda: os.close(os.open("victim.txt", os.O_WRONLY, dir_fd=d)))
attempt("openat(dirfd, new, O_CREAT)",
        lambda: os.close(os.open("openat-created", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)))
p = os.open("{{victim}}", os.O_PATH)
attempt("reopen an O_PATH descriptor for writing",
        lambda: os.close(os.open("/proc/self/fd/%d" % p, os.O_WRONLY)))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row2-open-by-handle",
        2,
        "name_to_handle_at + open_by_handle_at (bypasses paths and mounts)",
        """
class FH(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]
fh = FH()
fh.handle_bytes = 128
mount_id = ctypes.c_int()
if libc.name_to_handle_at(-100, b"{{victim}}", ctypes.byref(fh), ctypes.byref(mount_id), 0):
    print("denied name_to_handle_at: %s" % os.strerror(ctypes.get_errno()))
else:
    mfd = os.open("{{host}}", os.O_RDONLY | os.O_DIRECTORY)
    def by_handle():
        fd = libc.open_by_handle_at(mfd, ctypes.byref(fh), os.O_RDWR)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        os.write(fd, b"pwned by handle")
        return "wrote"
    attempt("open_by_handle_at O_RDWR", by_handle)
""",
        *FILES,
        python=True,
    ),
    attack(
        "row2-bind-mount",
        2,
        "bind-mount the host directory into the workspace, then write",
        "mkdir -p {{ws}}/mnt; mount --bind {{host}} {{ws}}/mnt && "
        "echo 'ESCAPE mount --bind succeeded'; echo pwned > {{ws}}/mnt/victim.txt",
        *FILES,
    ),
]


# -- row 3: devices, IPC and kernel knobs --------------------------------------------------------


def _block_devices() -> list[str]:
    devs = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/sys/class/block")):
            path = f"/dev/{name}"
            with contextlib.suppress(OSError):
                if stat.S_ISBLK(os.stat(path).st_mode):
                    devs.append(path)
    return devs


# Character devices opened for writing only (never written). Deliberately absent: watchdog
# (opening it arms it), snapshot, cpu_dma_latency (an open registers a QoS request).
CHAR_DEVICES = (
    "kmsg",
    "mem",
    "port",
    "tty0",
    "console",
    "kvm",
    "fuse",
    "loop-control",
    "btrfs-control",
    "autofs",
    "net/tun",
    "vhost-net",
    "uinput",
    "rfkill",
    "hwrng",
)
PROC_KNOBS = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/vm/drop_caches",
    "/proc/sysrq-trigger",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/fs/binfmt_misc/register",
    "/proc/sys/kernel/panic",
)
SYS_KNOBS = (
    "/sys/kernel/uevent_helper",
    "/sys/power/state",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/fs/cgroup/cgroup.procs",
    "/sys/fs/cgroup/unified/cgroup.procs",
    "/sys/module/printk/parameters/time",
)
# A harmless knob whose current value is written back (an escape would change nothing).
SYS_SAME_VALUE = (
    "/sys/block/loop0/queue/read_ahead_kb",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/defrag",
    "/sys/kernel/mm/ksm/sleep_millisecs",
)


def _open_for_write_body(list_name: str) -> str:
    return f"""
for path in "{{{{{list_name}}}}}".split(","):
    if path:
        attempt("open %s for writing (nothing is written)" % path,
                lambda: os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC)))
"""


def _writable_by_host(paths: Sequence[str]) -> list[str]:
    """Paths the audit itself can open for writing (opened and closed, nothing written):
    only those make a refusal inside the sandbox mean something."""
    usable = []
    for path in paths:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY))
        except OSError:
            continue
        usable.append(path)
    return usable


def _open_targets(key: str, paths: Sequence[str]) -> dict[str, Any]:
    usable = _writable_by_host(paths)
    if not usable:
        return {"skip": "the host itself cannot open any of them for writing"}
    return {key: ",".join(usable)}


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _unchanged_file(key: str) -> Check:
    """The host file ``setup.data[key]`` still holds what it held before the run."""

    def check(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
        path, before = setup.data[key], setup.data[key + "_before"]
        now = _read(path)
        return [] if now == before else [f"{path} changed: {before.strip()!r} -> {now.strip()!r}"]

    return check


def _same_value_knob(env: AttackEnv) -> dict[str, Any]:
    for knob in SYS_SAME_VALUE:
        if os.path.exists(knob) and os.stat(knob).st_mode & 0o200:
            return {"knob": knob, "knob_before": _read(knob)}
    return {"skip": "no harmless writable /sys knob on this host"}


def _librt() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    if not hasattr(lib, "mq_open"):
        lib = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1", use_errno=True)
    return lib


def _mqueue_absent(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """Look for the queue in the host's IPC namespace; remove it if the attack made one."""
    name = f"/bash-sandbox-audit-{env.token}".encode()
    lib = _librt()
    fd = lib.mq_open(name, os.O_RDONLY)
    if fd < 0:
        return []
    os.close(fd)
    lib.mq_unlink(name)
    return [f"POSIX message queue {name.decode()} exists in the host IPC namespace"]


def _sysv_hits(key: int) -> list[str]:
    hits = []
    for kind in ("shm", "msg", "sem"):
        for line in _read(f"/proc/sysvipc/{kind}").splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == str(key):
                hits.append(f"SysV {kind} id {fields[1]} with key {key} exists on the host")
                flag = {"shm": "-m", "msg": "-q", "sem": "-s"}[kind]
                with contextlib.suppress(OSError):
                    subprocess.run(["ipcrm", flag, fields[1]], capture_output=True, check=False)
    return hits


def _sysv_absent(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    return _sysv_hits(setup.data["ipc_key"])


def _blockdev_of(path: str) -> str | None:
    st = os.stat(path)
    uevent = _read(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/uevent")
    for line in uevent.splitlines():
        if line.startswith("DEVNAME="):
            dev = "/dev/" + line.split("=", 1)[1]
            return dev if os.path.exists(dev) else None
    return None


def _mknod_premise(env: AttackEnv) -> dict[str, Any]:
    devs = _block_devices()
    if not devs:
        return {"skip": "no block device on this host"}
    st = os.stat(devs[0])
    node = os.path.join(env.ws, "audit-blk")
    env.cleanup.add(lambda: remove_path(node))
    return {"major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev), "nodes": [node]}


ROW3 = [
    attack(
        "row3-dev-shm",
        3,
        "create a file in /dev/shm",
        "echo pwned > /dev/shm/bash-sandbox-audit-{{token}}; "
        "echo pwned > /dev/shm/bash-sandbox-audit-{{token}}-2",
        *FILES,
        host_paths_absent("shm"),
        extra=lambda env: _cleanup_paths(
            env,
            "shm",
            [
                f"/dev/shm/bash-sandbox-audit-{env.token}",
                f"/dev/shm/bash-sandbox-audit-{env.token}-2",
            ],
        ),
    ),
    attack(
        "row3-mqueue",
        3,
        "create a POSIX message queue (mq_open, /dev/mqueue)",
        """
name = b"/bash-sandbox-audit-{{token}}"
lib = libc if hasattr(libc, "mq_open") else ctypes.CDLL(ctypes.util.find_library("rt"),
                                                        use_errno=True)
def mq():
    fd = lib.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "created (judged from the host's namespace)"
try:
    print("mq_open:", mq())
except OSError as exc:
    print("denied mq_open:", exc)
if os.path.isdir("/dev/mqueue"):
    try:
        os.close(os.open("/dev/mqueue/bash-sandbox-audit-{{token}}", os.O_CREAT | os.O_WRONLY))
        print("created /dev/mqueue entry")
    except OSError as exc:
        print("denied /dev/mqueue:", exc)
""",
        *FILES,
        _mqueue_absent,
        python=True,
    ),
    attack(
        "row3-sysv-ipc",
        3,
        "create SysV shared memory, a message queue, a semaphore",
        """
key = {{ipc_key}}
for name, call in (("shmget", lambda: libc.shmget(key, 4096, 0o1000 | 0o600)),
                   ("msgget", lambda: libc.msgget(key, 0o1000 | 0o600)),
                   ("semget", lambda: libc.semget(key, 1, 0o1000 | 0o600))):
    print(name, "->", call(), "(judged from the host's namespace)")
""",
        *FILES,
        _sysv_absent,
        python=True,
        extra=lambda env: {
            "ipc_key": int.from_bytes(os.urandom(4), "big") & 0x3FFFFFFF | 0x10000000
        },
    ),
    attack(
        "row3-block-device-open",
        3,
        "open every host block device for writing (nothing written)",
        _open_for_write_body("devices"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("devices", _block_devices()),
    ),
    attack(
        "row3-mknod-block-device",
        3,
        "mknod a block device node in the workspace and open it for writing",
        "mknod {{ws}}/audit-blk b {{major}} {{minor}} && "
        "echo 'ESCAPE mknod made a block device'; "
        "{{py}} -c \"import os; os.close(os.open('{{ws}}/audit-blk', os.O_WRONLY)); "
        "print('ESCAPE opened the made node for writing')\"",
        *FILES,
        host_paths_absent("nodes"),
        extra=_mknod_premise,
        workspace_guard=False,
    ),
    attack(
        "row3-char-devices-open",
        3,
        "open host character devices for writing (kmsg, "
        "mem, port, tty0, console, kvm, fuse, ...; nothing written)",
        _open_for_write_body("chardevs"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("chardevs", [f"/dev/{d}" for d in CHAR_DEVICES]),
    ),
    attack(
        "row3-proc-sys-same-value",
        3,
        "write /proc/sys/vm/swappiness (its current value)",
        'v=$(cat /proc/sys/vm/swappiness); echo "$v" > /proc/sys/vm/swappiness && '
        'echo "ESCAPE wrote /proc/sys/vm/swappiness (same value $v)"',
        *FILES,
        _unchanged_file("knob"),
        extra=lambda env: {
            "knob": "/proc/sys/vm/swappiness",
            "knob_before": _read("/proc/sys/vm/swappiness"),
        },
    ),
    attack(
        "row3-proc-open-for-write",
        3,
        "open /proc knobs for writing (core_pattern, "
        "drop_caches, sysrq-trigger, ...; nothing written)",
        _open_for_write_body("knobs"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("knobs", PROC_KNOBS),
    ),
    attack(
        "row3-sys-same-value",
        3,
        "write a harmless /sys knob (its current value)",
        'v=$(cat {{knob}}); echo "$v" > {{knob}} && echo "ESCAPE wrote {{knob}}"',
        *FILES,
        _unchanged_file("knob"),
        extra=_same_value_knob,
    ),
    attack(
        "row3-sys-open-for-write",
        3,
        "open /sys knobs for writing (uevent_helper, "
        "power/state, cgroup.procs, ...; nothing written)",
        _open_for_write_body("knobs"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("knobs", SYS_KNOBS),
    ),
]


def _cleanup_paths(env: AttackEnv, key: str, paths: list[str]) -> dict[str, Any]:
    for p in paths:
        env.cleanup.add(functools.partial(remove_path, p))
    return {key: paths}


# -- row 4: protected names inside a writable root ----------------------------------------


def protected_attack(
    id: str,
    title: str,
    template: str,
    *,
    git: str = "repo",
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    kwargs: dict[str, Any] | None = None,
    modes: frozenset[SandboxMode] = BOTH_MODES,
) -> Attack:
    return attack(
        id,
        4,
        title,
        "cd {{ws}}\n" + template,
        *FILES,
        git=git,
        protected=True,
        workspace_guard=None,
        extra=extra,
        kwargs=kwargs,
        modes=modes,
    )


def _extra_root(env: AttackEnv) -> dict[str, Any]:
    extra_root = env.path("extra")
    os.makedirs(os.path.join(extra_root, ".git", "hooks"), exist_ok=True)
    with open(os.path.join(extra_root, ".git", "config"), "w") as fh:
        fh.write("[core]\n")
    return {
        "guards": {
            "extra/.git/hooks": os.path.join(extra_root, ".git", "hooks"),
            "extra/.git/config": os.path.join(extra_root, ".git", "config"),
        },
        "executor_kwargs": {"writable_roots": (extra_root,)},
    }


ROW4 = [
    protected_attack(
        "row4-hook-create",
        "create .git/hooks/pre-commit",
        "echo 'echo pwned' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit",
    ),
    protected_attack(
        "row4-hook-overwrite",
        "overwrite or delete an existing hook",
        "echo pwned > .git/hooks/pre-push.sample; rm -f .git/hooks/pre-push.sample",
    ),
    protected_attack(
        "row4-config-write",
        "write .git/config (git config, append, overwrite)",
        "git config core.hooksPath /tmp/evil; echo '[core]' >> .git/config; "
        "echo pwned > .git/config",
    ),
    protected_attack(
        "row4-config-replace",
        "rename, delete or relink .git/config",
        "mv .git/config .git/config.old; rm -f .git/config; "
        "ln -sf /dev/null .git/config; echo pwned > .git/config",
    ),
    protected_attack(
        "row4-no-git-dir",
        "create .git/hooks/pre-commit and .git/config when .git does not exist",
        "mkdir -p .git/hooks && echo pwned > .git/hooks/pre-commit; echo '[core]' > .git/config",
        git="none",
    ),
    protected_attack(
        "row4-hooks-dir-missing",
        "create .git/hooks when only it is missing",
        "mkdir .git/hooks; echo pwned > .git/hooks/pre-commit",
        git="no-hooks",
    ),
    protected_attack(
        "row4-hooks-replaced-by-symlink",
        "replace .git/hooks by a symlink to attacker hooks",
        "mkdir -p evil && echo pwned > evil/pre-commit; rm -rf .git/hooks; "
        "ln -sfn ../evil .git/hooks; mv .git/hooks .git/hooks.old; "
        "ln -sfn ../evil .git/hooks",
    ),
    protected_attack(
        "row4-git-dir-renamed",
        "rename .git away (or remove it) and recreate hooks and config",
        "mv .git .git-old; rm -rf .git; mkdir -p .git/hooks; "
        "echo pwned > .git/hooks/pre-commit; echo '[core]' > .git/config",
    ),
    protected_attack(
        "row4-config-symlink-planted",
        "replace a .git/config that is a symlink (the link, and its target)",
        "echo pwned >> real-config; rm -f .git/config; "
        "printf '[core]\\n\\thooksPath = /tmp/evil\\n' > .git/config",
        git="config-link",
        extra=lambda env: {"guards": {"ws/real-config": os.path.join(env.ws, "real-config")}},
    ),
    protected_attack(
        "row4-hooks-symlink-planted",
        "replace a .git/hooks that is a symlink (the link, and its target)",
        "echo pwned > real-hooks/pre-commit; rm -f .git/hooks; mkdir .git/hooks; "
        "echo pwned > .git/hooks/pre-commit",
        git="hooks-link",
        extra=lambda env: {"guards": {"ws/real-hooks": os.path.join(env.ws, "real-hooks")}},
    ),
    protected_attack(
        "row4-alias-paths",
        "reach hooks through ./, //, a new symlink, cd",
        "echo pwned > ./.git/./hooks/pre-commit; "
        "echo pwned > .git//hooks//pre-commit2; "
        "ln -s .git/hooks h && echo pwned > h/pre-commit3; "
        "cd .git/hooks && echo pwned > pre-commit4",
    ),
    protected_attack(
        "row4-configured-name",
        "write, delete, rename, chmod a configured protected name (.envrc)",
        "echo pwned > .envrc; chmod 777 .envrc; mv .envrc envrc.old; rm -f .envrc",
    ),
    protected_attack(
        "row4-configured-name-missing",
        "create a configured protected name that does not exist (deploy/secrets.env)",
        "mkdir -p deploy && echo pwned > deploy/secrets.env",
    ),
    protected_attack(
        "row4-extra-writable-root",
        "protected names inside an extra writable root",
        "echo pwned > {{root}}/extra/.git/hooks/pre-commit; "
        "echo pwned >> {{root}}/extra/.git/config",
        extra=_extra_root,
        modes=WORKSPACE_WRITE,
    ),
]


# -- row 5: read deny_read paths -------------------------------------------------------------


def secret_attack(
    id: str,
    title: str,
    template: str,
    *,
    python: bool = False,
    listing: bool = False,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    plant: Callable[[AttackEnv], dict[str, Any]] | None = None,
) -> Attack:
    def extra(env: AttackEnv) -> dict[str, Any]:
        values = plant(env) if plant else {}
        values["check_listing"] = listing
        return values

    return attack(
        id,
        5,
        title,
        template,
        secrets_kept,
        no_escape_lines,
        python=python,
        modes=modes,
        extra=extra,
    )


def _plant_secret_links(env: AttackEnv) -> dict[str, Any]:
    os.symlink(os.path.join(env.home, ".ssh"), os.path.join(env.ws, "ssh-link"))
    os.symlink(os.path.join(env.home, ".netrc"), os.path.join(env.ws, "netrc-link"))
    return {}


FIEMAP = 0xC020660B


def _physical_offset(path: str) -> int | None:
    """Where ``path``'s first block lies on its device (FIEMAP after a sync), if known."""
    import fcntl

    buf = bytearray(struct.pack("=QQIIII", 0, 1 << 30, 1, 0, 1, 0) + b"\0" * 56)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FIEMAP, buf)
    except OSError:
        return None
    finally:
        os.close(fd)
    _start, _len, _flags, mapped, _count, _res = struct.unpack_from("=QQIIII", buf)
    if mapped < 1:
        return None
    _logical, physical, _length = struct.unpack_from("=QQQ", buf, 32)
    return int(physical)


def _raw_disk_premise(env: AttackEnv) -> dict[str, Any]:
    """A canary file whose block the host (as root) can read back from the raw device."""
    if os.geteuid() != 0:
        return {"skip": "the executor is not root: raw block devices are not readable here"}
    canary = f"AUDIT-SECRET-RAW-{env.token}"
    path = os.path.join(env.home, ".ssh", "id_rawdisk")
    with open(path, "w") as fh:
        fh.write((canary + "\n") * (8192 // (len(canary) + 1)))
    os.chmod(path, 0o600)
    dev = _blockdev_of(path)
    offset = _physical_offset(path)  # FIEMAP_FLAG_SYNC flushes the data first
    if dev is None or offset is None:
        return {"skip": "the secret's block on the raw device is unknown on this filesystem"}
    os.sync()
    try:
        fd = os.open(dev, os.O_RDONLY)
        try:
            seen = os.pread(fd, 4096, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        return {"skip": f"the host itself cannot read {dev}: {exc.strerror}"}
    if canary.encode() not in seen:
        return {"skip": "the secret's block could not be located on the raw device"}
    return {"rawdev": dev, "rawoff": offset, "extra_canaries": [canary]}


ROW5 = [
    secret_attack(
        "row5-cat-files",
        "cat every denied file (ssh key, .netrc, aws, a denied path inside the workspace)",
        "cat {{home}}/.ssh/id_ed25519; cat {{home}}/.netrc; "
        "cat {{home}}/.aws/credentials; cat {{ws}}/secrets/.env",
    ),
    secret_attack(
        "row5-list-dirs",
        "list denied directories (ls, find, glob)",
        "ls -la {{home}}/.ssh; find {{home}}/.ssh {{home}}/.aws {{ws}}/secrets; "
        "echo {{home}}/.ssh/*",
        listing=True,
    ),
    secret_attack(
        "row5-symlink-planted",
        "read through symlinks to denied paths planted in the workspace",
        "cat {{ws}}/ssh-link/id_ed25519 {{ws}}/netrc-link; ls {{ws}}/ssh-link",
        listing=True,
        plant=_plant_secret_links,
    ),
    secret_attack(
        "row5-symlink-made-by-command",
        "make symlinks to denied paths, then read",
        "ln -s {{home}}/.ssh {{ws}}/l1 && cat {{ws}}/l1/id_ed25519; "
        "ln -s {{home}}/.netrc {{ws}}/l2 && cat {{ws}}/l2; "
        "t=${TMPDIR:-/tmp}; ln -s {{home}}/.netrc $t/l3-{{token}} && "
        "cat $t/l3-{{token}}",
    ),
    secret_attack(
        "row5-hardlink-made-by-command",
        "hardlink denied files into the workspace, then read",
        "ln {{home}}/.netrc {{ws}}/hl && cat {{ws}}/hl; "
        "ln {{home}}/.ssh/id_ed25519 {{ws}}/hl2 && cat {{ws}}/hl2",
    ),
    secret_attack(
        "row5-symlink-target",
        "read the target of a denied symlink (.aws -> real-aws) directly",
        "cat {{home}}/real-aws/credentials",
    ),
    secret_attack(
        "row5-dotdot-and-proc",
        "reach denied files via `..`, /proc/self/root, /proc/self/cwd",
        "cat {{ws}}/../home/.netrc; cat /proc/self/root{{home}}/.netrc; "
        "cd {{home}} && cat /proc/self/cwd/.netrc",
    ),
    secret_attack(
        "row5-copy-out",
        "copy denied files into the workspace (cp, tar, base64)",
        "cp -r {{home}}/.ssh {{ws}}/exfil; tar cf {{ws}}/x.tar -C {{home}} .netrc .ssh; "
        "base64 {{home}}/.netrc",
    ),
    secret_attack(
        "row5-search",
        "search for the secrets (grep -r, find -exec cat)",
        "grep -r AUDIT-SECRET {{home}} {{ws}}; "
        "find {{home}} -type f -exec cat {} + 2>&1 | head -50",
        listing=True,
    ),
    secret_attack(
        "row5-reopen-and-openat",
        "O_PATH + /proc/self/fd reopen, openat relative to the home directory",
        """
for path in ("{{home}}/.netrc", "{{home}}/.ssh/id_ed25519"):
    try:
        p = os.open(path, os.O_PATH)
        with open("/proc/self/fd/%d" % p) as fh:
            print(fh.read())
    except OSError as exc:
        print("denied reopen:", exc)
try:
    home = os.open("{{home}}", os.O_RDONLY | os.O_DIRECTORY)
    print(os.read(os.open(".netrc", os.O_RDONLY, dir_fd=home), 200))
except OSError as exc:
    print("denied openat:", exc)
""",
        python=True,
    ),
    secret_attack(
        "row5-unmount-cover",
        "unmount what hides the denied paths, then read",
        "umount {{home}}/.ssh; umount -l {{home}}/.netrc; "
        "cat {{home}}/.ssh/id_ed25519 {{home}}/.netrc",
    ),
    secret_attack(
        "row5-rename-cover",
        "rename the hidden path (or its parent) inside the workspace, then read",
        "mv {{ws}}/secrets {{ws}}/moved && cat {{ws}}/moved/.env; "
        "mv {{ws}}/secrets/.env {{ws}}/env2 && cat {{ws}}/env2",
        modes=WORKSPACE_WRITE,
    ),
    secret_attack(
        "row5-raw-block-device",
        "read a secret's block straight from the raw block device",
        """
fd = os.open("{{rawdev}}", os.O_RDONLY)
print(os.pread(fd, 4096, {{rawoff}}).decode(errors="replace"))
""",
        python=True,
        plant=_raw_disk_premise,
    ),
    victim_attack(
        "row5-proc-pid-root",
        5,
        "read denied files via /proc/<pid>/root and cwd of a host process",
        "cat /proc/{{vpid}}/root{{home}}/.netrc; cat /proc/{{vpid}}/cwd/../home/.netrc",
        secrets_kept,
    ),
]


# -- rows 6 and 7: other processes ------------------------------------------------------------


def _nice_unchanged(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    victim: Victim = setup.data["victim"]
    found = []
    fields = proc_stat_fields(victim.pid)
    if fields and fields[16] != "0":
        found.append(f"victim nice value changed to {fields[16]}")
    if proc_field(victim.pid, "Cpus_allowed_list") != setup.data["affinity"]:
        found.append("victim CPU affinity changed")
    if _read(f"/proc/{victim.pid}/limits") != setup.data["limits"]:
        found.append("victim resource limits changed")
    return found


def _tuning_prepare() -> Callable[[AttackEnv], Awaitable[AttackSetup]]:
    base = victim_attack(
        "_",
        6,
        "_",
        "renice -n 10 -p {{vpid}} && echo 'ESCAPE renice'; "
        "taskset -p 1 {{vpid}} && echo 'ESCAPE taskset'; "
        "prlimit --pid {{vpid}} --nofile=16:16 && echo 'ESCAPE prlimit'; "
        "ionice -c3 -p {{vpid}} && echo 'ESCAPE ionice'",
    )

    async def prepare(env: AttackEnv) -> AttackSetup:
        setup = await base.prepare(env)
        if setup.skip:
            return setup
        victim: Victim = setup.data["victim"]
        data = dict(setup.data)
        data.update(
            affinity=proc_field(victim.pid, "Cpus_allowed_list"),
            limits=_read(f"/proc/{victim.pid}/limits"),
        )
        return AttackSetup(command=setup.command, data=data)

    return prepare


SIGNAL_SYSCALLS = """
pid = {{vpid}}
attempt("kill(SIGUSR2)", lambda: os.kill(pid, signal.SIGUSR2))
def via_pidfd():
    pfd = sys_call("pidfd_open", pid, 0)
    return sys_call("pidfd_send_signal", pfd, signal.SIGUSR1, None, 0)
attempt("pidfd_open + pidfd_send_signal", via_pidfd)
attempt("tgkill", lambda: sys_call("tgkill", pid, pid, signal.SIGUSR2))
info = (ctypes.c_int * 32)(signal.SIGUSR1, 0, -1)
attempt("rt_sigqueueinfo", lambda: sys_call("rt_sigqueueinfo", pid, signal.SIGUSR1,
                                            ctypes.byref(info)))
"""

ROW6 = [
    victim_attack(
        "row6-kill-0-victim",
        6,
        "kill -0 a host process",
        "kill -0 {{vpid}} && echo 'ESCAPE kill -0 reached the victim'",
        no_escape_lines,
    ),
    victim_attack(
        "row6-kill-term-victim",
        6,
        "SIGTERM, SIGHUP, SIGUSR1 a host process",
        "for s in TERM HUP USR1; do kill -$s {{vpid}} && "
        'echo "ESCAPE kill -$s reached the victim"; done',
        no_escape_lines,
    ),
    victim_attack(
        "row6-kill-kill-victim",
        6,
        "SIGKILL a host process",
        "kill -KILL {{vpid}} && echo 'ESCAPE kill -KILL reached the victim'",
        no_escape_lines,
    ),
    victim_attack(
        "row6-stop-cont-victim",
        6,
        "SIGSTOP then SIGCONT a host process",
        "kill -STOP {{vpid}} && echo 'ESCAPE kill -STOP reached the victim'; "
        "sleep 0.2; kill -CONT {{vpid}}",
        no_escape_lines,
    ),
    victim_attack(
        "row6-kill-process-group",
        6,
        "signal a host process group",
        "kill -TERM -- -{{vpid}} && echo 'ESCAPE kill -TERM reached the group'; "
        "kill -0 -- -{{vpid}} && echo 'ESCAPE kill -0 reached the group'",
        no_escape_lines,
    ),
    victim_attack(
        "row6-signal-syscalls",
        6,
        "kill(2), pidfd_send_signal, tgkill, rt_sigqueueinfo",
        SIGNAL_SYSCALLS,
        no_escape_lines,
        python=True,
    ),
    attack(
        "row6-kill-0-executor",
        6,
        "kill -0 the executor's own process (signal 0 only)",
        "kill -0 {{audit_pid}} && echo 'ESCAPE kill -0 reached the executor'; "
        "{{py}} -c 'import os; os.kill({{audit_pid}}, 0); "
        'print("ESCAPE os.kill(executor, 0) succeeded")\'',
        no_escape_lines,
    ),
    Attack(
        "row6-retune-victim",
        6,
        "renice, taskset, prlimit, ionice a host process",
        _tuning_prepare(),
        verify_attack(no_escape_lines, _nice_unchanged, victim_untouched),
        drives.foreground,
    ),
]

_PTRACE = """
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
pid = {{vpid}}
"""

ROW7 = [
    victim_attack(
        "row7-ptrace-attach",
        7,
        "PTRACE_ATTACH a host process",
        _PTRACE
        + """
def attach():
    if libc.ptrace(16, pid, None, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    os.waitpid(pid, 0x40000000)
    libc.ptrace(17, pid, None, None)
    return "attached and detached"
attempt("PTRACE_ATTACH", attach)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-ptrace-seize",
        7,
        "PTRACE_SEIZE a host process",
        _PTRACE
        + """
def seize():
    if libc.ptrace(0x4206, pid, None, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    time.sleep(0.3)
    return "seized"
attempt("PTRACE_SEIZE", seize)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-gdb-attach",
        7,
        "gdb -p a host process",
        "timeout 10 gdb -p {{vpid}} -batch -nx -ex 'info registers pc' 2>&1 | "
        "grep -E '^(pc|rip) ' && echo 'ESCAPE gdb read the victim registers'",
        no_escape_lines,
        needs="gdb",
    ),
    victim_attack(
        "row7-strace-attach",
        7,
        "strace -p a host process",
        "timeout 1 strace -p {{vpid}} -o /dev/null 2>&1 | grep -i 'attached' && "
        "echo 'ESCAPE strace attached'",
        no_escape_lines,
        needs="strace",
    ),
    victim_attack(
        "row7-process-vm-writev",
        7,
        "process_vm_writev into a host process",
        """
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
data = ctypes.create_string_buffer(b"PWNED-BY-THE-AUDIT", 18)
local = IOV(ctypes.cast(data, ctypes.c_void_p), 18)
remote = IOV(ctypes.c_void_p({{vaddr}}), 18)
attempt("process_vm_writev", lambda: sys_call("process_vm_writev", {{vpid}}, ctypes.byref(local),
                                              1, ctypes.byref(remote), 1, 0))
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-process-vm-readv",
        7,
        "process_vm_readv from a host process",
        """
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
data = ctypes.create_string_buffer(64)
local = IOV(ctypes.cast(data, ctypes.c_void_p), 64)
remote = IOV(ctypes.c_void_p({{vaddr}}), 64)
if attempt("process_vm_readv", lambda: sys_call("process_vm_readv", {{vpid}},
           ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)):
    print(data.raw.decode(errors="replace"))
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-proc-mem-write",
        7,
        "write /proc/<pid>/mem of a host process",
        """
def poke():
    with open("/proc/{{vpid}}/mem", "r+b", buffering=0) as fh:
        fh.seek({{vaddr}})
        return fh.write(b"PWNED-BY-THE-AUDIT")
attempt("write /proc/pid/mem", poke)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-proc-mem-read",
        7,
        "read /proc/<pid>/mem of a host process",
        """
def peek():
    with open("/proc/{{vpid}}/mem", "rb", buffering=0) as fh:
        fh.seek({{vaddr}})
        return fh.read(64).decode(errors="replace")
print(attempt("read /proc/pid/mem", peek))
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-pidfd-getfd",
        7,
        "steal a descriptor of a host process (pidfd_getfd)",
        """
def steal():
    pfd = sys_call("pidfd_open", {{vpid}}, 0)
    return sys_call("pidfd_getfd", pfd, {{vfd}}, 0)
attempt("pidfd_getfd", steal)
""",
        no_escape_lines,
        python=True,
    ),
    victim_attack(
        "row7-proc-environ",
        7,
        "read /proc/<pid>/environ of a host process",
        "tr '\\0' '\\n' < /proc/{{vpid}}/environ",
        no_escape_lines,
    ),
]


# -- row 8: privilege -----------------------------------------------------------------------


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


def _file_caps_copy(env: AttackEnv) -> dict[str, Any]:
    """A copy of python carrying file capabilities (CAP_SETUID, CAP_DAC_OVERRIDE; +ep)."""
    if os.geteuid() != 0:
        return {"skip": "setting file capabilities needs root"}
    target = os.path.join(env.host, "cap-python")
    for source in ("/usr/bin/python3", env.python or ""):
        if not source or not os.path.exists(source):
            continue
        shutil.copy(os.path.realpath(source), target)
        done = subprocess.run([target, "-c", "pass"], capture_output=True, check=False, timeout=20)
        if done.returncode == 0:
            break
    else:
        return {"skip": "no python binary that still runs when copied"}
    caps = (1 << 7) | (1 << 1)  # VFS_CAP_REVISION_2 | effective; permitted = the two caps
    os.setxattr(target, "security.capability", struct.pack("<IIIII", 0x02000001, caps, 0, 0, 0))
    return {}


ROW8 = [
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
        extra=lambda env: _cleanup_paths(env, "nodes", [os.path.join(env.ws, "audit-null")]),
    ),
]


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


ROW9 = [
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


ROW10 = [
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


# -- row 11: outliving the run ---------------------------------------------------------------

# Six ways to daemonise; each daemon's argv[0] carries the run token (from the environment,
# so the command's own text does not), which is how the host finds them.
DAEMONS = r"""T="$BASH_SANDBOX_AUDIT_RUN-dmn"
setsid bash -c "exec -a $T-setsid sleep 300" </dev/null >/dev/null 2>&1 &
nohup bash -c "exec -a $T-nohup sleep 300" </dev/null >/dev/null 2>&1 &
( bash -c "exec -a $T-doublefork sleep 300" </dev/null >/dev/null 2>&1 & )
bash -c "trap '' TERM HUP INT; exec -a $T-ignoreterm sleep 300" </dev/null >/dev/null 2>&1 &
bash -c "exec -a $T-pipeholder sleep 300" &
{{py}} -c 'import os, sys
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): os._exit(0)
fd = os.open("/dev/null", os.O_RDWR)
for n in (0, 1, 2): os.dup2(fd, n)
os.execvp("sleep", [sys.argv[1] + "-pyfork", "300"])' "$T"
disown -a 2>/dev/null
echo DAEMONS-STARTED
"""
DAEMON_COUNT = 6


def _verify_lifetime(trigger: str) -> Verify:
    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        if outcome.error is not None:
            return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
        seen: list[tuple[int, str]] = outcome.notes.get("seen", [])
        if len(seen) < DAEMON_COUNT:
            return audit_error(
                f"premise failed: {len(seen)} of {DAEMON_COUNT} daemons appeared on the host",
                [c for _, c in seen]
                or [shorten(env, str(outcome.notes.get("helper_stderr", ""))[-300:])],
            )
        survivors = await wait_tagged_gone(env.token, 5)
        if survivors:
            return escaped(
                f"{len(survivors)} process(es) of the command survived {trigger}",
                [f"pid {p.pid}: {p.cmdline}" for p in survivors],
            )
        return contained(f"all {len(seen)} daemons died after {trigger}")

    return verify


def lifetime_attack(trigger: str, title: str, tail: str, timeout_ms: int, drive: Drive) -> Attack:
    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := _needs_python(env):
            return AttackSetup(skip=why)
        build_layout(env)
        return AttackSetup(
            command=env.render(BEGIN + DAEMONS + tail),
            timeout_ms=timeout_ms,
            data={"tag": f"{env.token}-dmn-", "expected": DAEMON_COUNT},
        )

    return Attack(
        f"row11-after-{trigger}", 11, title, prepare, _verify_lifetime(trigger), drive, budget_s=60
    )


ROW11 = [
    lifetime_attack(
        "exit",
        "daemons planted by a foreground command that exits normally",
        "sleep 1\n",
        30_000,
        drives.lifetime("exit"),
    ),
    lifetime_attack(
        "timeout",
        "daemons planted by a command that times out",
        "sleep 300\n",
        2_500,
        drives.lifetime("timeout"),
    ),
    lifetime_attack(
        "abort",
        "daemons planted by a command aborted via AbortController",
        "sleep 300\n",
        30_000,
        drives.lifetime("abort"),
    ),
    lifetime_attack(
        "cancel",
        "daemons planted by a command whose awaiting task is cancelled",
        "sleep 300\n",
        30_000,
        drives.lifetime("cancel"),
    ),
    lifetime_attack(
        "kill",
        "daemons planted by a background process that is kill()ed",
        "sleep 300\n",
        30_000,
        drives.lifetime("kill"),
    ),
    lifetime_attack(
        "aclose",
        "daemons planted by a background process when the executor is aclose()d",
        "sleep 300\n",
        30_000,
        drives.lifetime("aclose"),
    ),
    lifetime_attack(
        "background-exit",
        "daemons planted by a background process that exits",
        "sleep 1\n",
        30_000,
        drives.lifetime("background-exit"),
    ),
    lifetime_attack(
        "executor-sigkill",
        "daemons planted while the executor's process is SIGKILLed",
        "sleep 300\n",
        30_000,
        drives.executor_sigkilled,
    ),
]


# -- row 12: exhausting the executor -------------------------------------------------------------

MEMORY_LIMIT_KIB = 32 * 1024  # growth allowed over the run, far above the 64 kB output cap
OUTPUT_CAP = 64_000


def _seq_digest(n: int) -> str:
    return hashlib.sha256("".join(f"{i}\n" for i in range(1, n + 1)).encode()).hexdigest()


def _file_digest(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _verify_flood(
    stream: str,
    size: int,
    digest: Callable[[AttackEnv], str | None] | None,
    *,
    over_spill_cap: bool = False,
    background: bool = False,
) -> Verify:
    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        m: dict[str, Any] | None = outcome.notes.get("measured")
        if m is None:
            return audit_error(
                "the measured run did not report",
                [shorten(env, str(outcome.notes.get("helper_stderr", ""))[-400:])],
            )
        evidence: list[str] = []
        base = m["rss_before_read"] if background else m["rss_before"]
        growth = m["hwm_after"] - base
        if growth > MEMORY_LIMIT_KIB:
            what = "reading the output" if background else "the run"
            evidence.append(
                f"executor memory grew by {growth // 1024} MiB during {what} "
                f"(limit {MEMORY_LIMIT_KIB // 1024} MiB)"
            )
        if background:
            return (
                escaped(evidence[0], evidence)
                if evidence
                else contained(f"read of {m['read_chars']} chars stayed under the limit")
            )
        chars = m[f"{stream}_chars"]
        if chars > OUTPUT_CAP:
            evidence.append(f"result text holds {chars} chars (cap {OUTPUT_CAP})")
        spill = m[f"{stream}_spill"]
        if over_spill_cap:
            leftovers = _files_in(m.get("spill_dir"))
            if spill is not None:
                evidence.append("a spill path was reported for a stream beyond the spill cap")
            if leftovers:
                evidence.append(f"partial spill files left behind: {leftovers[:3]}")
        elif spill is None:
            evidence.append(f"no spill file for a truncated {stream} of {size} bytes")
        else:
            if spill["size"] != size:
                evidence.append(f"spill holds {spill['size']} of {size} bytes")
            want = digest(env) if digest else None
            if want is not None and spill["sha256"] != want:
                evidence.append("spill content differs from what the command wrote")
            if spill["mode"] != 0o600 or spill["dir_mode"] != 0o700:
                evidence.append(
                    f"spill modes {spill['mode']:o}/{spill['dir_mode']:o} (want 600/700)"
                )
        if evidence:
            return escaped(evidence[0], evidence)
        return contained(
            f"peak +{max(growth, 0) // 1024} MiB, text {chars} chars"
            + ("" if over_spill_cap else f", spill {size} bytes intact")
        )

    return verify


def _files_in(path: str | None) -> list[str]:
    if not path or not os.path.isdir(path):
        return []
    return sorted(os.listdir(path))


def flood_attack(
    id: str,
    title: str,
    command: str,
    *,
    stream: str = "stdout",
    size: int,
    digest: Callable[[AttackEnv], str | None] | None = None,
    spill_cap: int = 256 * 1024 * 1024,
    over_spill_cap: bool = False,
    background: bool = False,
    premise: Callable[[AttackEnv], None] | None = None,
) -> Attack:
    async def prepare(env: AttackEnv) -> AttackSetup:
        build_layout(env)
        if premise is not None:
            premise(env)
        return AttackSetup(
            command=env.render(command),
            timeout_ms=60_000,
            executor_kwargs={"max_spill_bytes": spill_cap},
            data={"background": background},
        )

    return Attack(
        id,
        12,
        title,
        prepare,
        _verify_flood(stream, size, digest, over_spill_cap=over_spill_cap, background=background),
        drives.measured,
        budget_s=90,
    )


def _write_blob(env: AttackEnv) -> None:
    with open(os.path.join(env.host, "blob.bin"), "wb") as fh:
        fh.write(os.urandom(20 * 1024 * 1024))


MB200 = 200 * 1024 * 1024
ROW12 = [
    flood_attack(
        "row12-200mb-stdout", "200 MB on stdout", f"head -c {MB200} /dev/zero", size=MB200
    ),
    flood_attack(
        "row12-million-lines",
        "a million lines",
        "seq 1 1000000",
        size=6888896,
        digest=lambda env: _seq_digest(1_000_000),
    ),
    flood_attack(
        "row12-binary",
        "20 MB of random binary output",
        "cat {{host}}/blob.bin",
        size=20 * 1024 * 1024,
        digest=lambda env: _file_digest(os.path.join(env.host, "blob.bin")),
        premise=_write_blob,
    ),
    flood_attack(
        "row12-stderr-flood",
        "100 MB on stderr",
        f"head -c {100 * 1024 * 1024} /dev/zero >&2",
        stream="stderr",
        size=100 * 1024 * 1024,
    ),
    flood_attack(
        "row12-one-huge-line",
        "one 50 MB line without a newline",
        "head -c 52428800 /dev/zero | tr '\\0' a",
        size=52428800,
    ),
    flood_attack(
        "row12-beyond-spill-cap",
        "output beyond the spill cap (disk stays bounded)",
        f"head -c {32 * 1024 * 1024} /dev/zero",
        size=32 * 1024 * 1024,
        spill_cap=8 * 1024 * 1024,
        over_spill_cap=True,
    ),
    flood_attack(
        "row12-background-read",
        "100 MB from a background process, then read_output()",
        f"head -c {100 * 1024 * 1024} /dev/zero",
        size=100 * 1024 * 1024,
        background=True,
    ),
]


# -- row 13: the executor's secrets ----------------------------------------------------------


def session_canaries_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = outcome.all_output()
    return [
        f"{name} from the executor's environment is visible"
        for name, value in env.canaries.items()
        if value in text
    ]


def environ_unread(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """`/proc/<executor>/environ` shows the environment the executor started with (later
    changes, like the audit's canaries, are not in it): any byte read is a leak."""
    for line in outcome.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["ENVIRON-BYTES"] and len(parts) == 2 and parts[1] != "0":
            return [f"{parts[1]} bytes of the executor's environment were readable"]
    return []


SPILL_FIRST = (
    '{{py}} -c \'import sys; sys.stdout.write(("AUDIT-SPILL-" + sys.argv[1] + '
    '"\\n") * 400)\' {{token}}'
)


def _verify_spill(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    if outcome.error is not None:
        return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
    spill = outcome.notes.get("spill_path")
    if not spill or outcome.result is None:
        return audit_error("premise failed: the first run did not spill")
    second = outcome.result.stdout.text + outcome.result.stderr.text
    if outcome.result.stdout.spill_path:  # a successful read overflows the small cap
        with open(outcome.result.stdout.spill_path, errors="replace") as fh:
            second = fh.read(1 << 20) + second
    if "AUDIT-BEGIN" not in second:
        return audit_error("premise failed: the second run did not start")
    evidence = []
    if f"AUDIT-SPILL-{env.token}" in second:
        evidence.append("another run's spill file was read")
    name = os.path.basename(spill)
    stem = name.split(".")[0]
    if len(stem) < 32 or any(c not in "0123456789abcdef" for c in stem):
        evidence.append(f"spill file name {name!r} is predictable")
    mode, dir_mode = outcome.notes.get("spill_mode"), outcome.notes.get("spill_dir_mode")
    if mode != 0o600 or dir_mode != 0o700:
        evidence.append(f"spill modes {mode:o}/{dir_mode:o} (want 600/700)")
    if evidence:
        return escaped(evidence[0], evidence)
    return contained(why_contained(env, outcome) or "spill unreadable")


def spill_attack(id: str, title: str, second: str, *, fresh: bool) -> Attack:
    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := _needs_python(env):
            return AttackSetup(skip=why)
        build_layout(env)
        return AttackSetup(
            command=env.render(BEGIN + second, strict=False),
            data={"first": env.render(SPILL_FIRST), "fresh_executor": fresh},
        )

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        return _verify_spill(env, setup, outcome)

    return Attack(id, 13, title, prepare, verify, drives.two_runs)


ROW13 = [
    attack(
        "row13-credential-env",
        13,
        "credential-shaped variables of the executor "
        "(GITHUB_TOKEN, *_SECRET, *_KEY, *_PASSWORD, ...) and start-up hooks",
        "env; tr '\\0' '\\n' < /proc/self/environ; {{py}} -c 'import os; print(dict(os.environ))'",
        session_canaries_kept,
        output_lacks("AUDIT-BASH-ENV-HOOK-RAN"),
    ),
    attack(
        "row13-executor-environ",
        13,
        "read the executor's environment via /proc (what it held at start, credentials included)",
        "printf 'ENVIRON-BYTES %s\\n' \"$(wc -c < /proc/{{audit_pid}}/environ)\"; "
        "tr '\\0' '\\n' < /proc/{{audit_pid}}/environ",
        session_canaries_kept,
        environ_unread,
    ),
    spill_attack(
        "row13-spill-same-executor",
        "read the spill file of an earlier run of the same executor",
        "cat {{spill}}; ls -la {{spill_dir}} {{spill_parent}}; "
        "find {{spill_parent}} -type f -exec cat {} + 2>&1 | head",
        fresh=False,
    ),
    spill_attack(
        "row13-spill-other-executor",
        "read the spill file of another executor's run",
        "cat {{spill}}; ls -la {{spill_dir}} {{spill_parent}}; "
        "find {{spill_parent}} -type f -exec cat {} + 2>&1 | head",
        fresh=True,
    ),
    spill_attack(
        "row13-spill-search",
        "search the temp dirs for spill files without knowing the path",
        "timeout 20 grep -rl AUDIT-SPILL-{{token}} /tmp ${TMPDIR:-/tmp} "
        "2>/dev/null | "
        "head -20 | xargs -r cat 2>&1 | head -5",
        fresh=True,
    ),
]


# -- row 14: runners -------------------------------------------------------------------------

RUNNER_COMMAND = BEGIN + "echo ran > {{ws}}/marker-{{token}}\n"
TAMPERED = """#!/bin/sh
# drop every bwrap option and run the command unconfined
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""


def _script(env: AttackEnv, name: str, body: str) -> str:
    os.makedirs(env.path("runner"), exist_ok=True)
    path = env.path("runner", name)
    with open(path, "w") as fh:
        fh.write(body)
    os.chmod(path, 0o755)  # noqa: S103 - a runner script must be executable
    return path


def _after_probe(env: AttackEnv, then: str) -> str:
    from bash_sandbox.backends.bwrap import find_bwrap

    bwrap = find_bwrap() or "/usr/bin/bwrap"
    calls = env.path("runner", "calls")
    return f'#!/bin/sh\nif [ ! -e {calls} ]; then : > {calls}; exec {bwrap} "$@"; fi\n' + then


def _runner_data(env: AttackEnv, kind: str) -> dict[str, Any]:
    """The runner argv (and, for a tampered runner under root, the copy-on-write view)."""
    data: dict[str, Any] = {"markers": [env.path("ws", f"marker-{env.token}")]}
    if kind == "missing":
        data["runner"] = [env.path("runner", "does-not-exist")]
    elif kind == "broken":
        data["runner"] = [
            _script(env, "broken", "#!/bin/sh\necho 'bwrap: setup failed' >&2\nexit 1\n")
        ]
    elif kind == "hanging":
        pidfile = env.path("runner", "pid")
        data["runner"] = [
            _script(env, "hanging", f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 30\n")
        ]
        data["pidfile"] = pidfile
        env.cleanup.add(lambda: drives.kill_pid_file(pidfile))
    elif kind in ("tampered", "tampered-unprivileged"):
        data["runner"] = [_script(env, "tampered", TAMPERED)]
    elif kind in ("fails-after-probe", "fails-after-probe-background"):
        data["runner"] = [
            _script(env, "flaky", _after_probe(env, "echo 'bwrap: setup failed' >&2\nexit 1\n"))
        ]
    elif kind == "tampered-after-probe":
        data["runner"] = [_script(env, "sleeper", _after_probe(env, TAMPERED.split("\n", 1)[1]))]
    return data


def _overlay_config(env: AttackEnv, unprivileged: bool) -> dict[str, Any] | str:
    """Dirs for the copy-on-write view; what an ordinary user must be able to reach."""
    cfg: dict[str, Any] = {"overlay": os.geteuid() == 0}
    if not cfg["overlay"]:
        return cfg
    for d in ("upper", "work", "merged"):
        os.makedirs(env.path("ov", d), exist_ok=True)
        cfg[d] = env.path("ov", d)
    if unprivileged:
        tmpdir = env.path("nobody-tmp")
        os.makedirs(tmpdir, exist_ok=True)
        import bash_sandbox

        reach = [
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            os.path.dirname(os.path.dirname(bash_sandbox.__file__)),
            env.ws,
            tmpdir,
            env.path("runner"),
        ]
        open_up: set[str] = set()
        root_dev = os.stat("/").st_dev
        for path in reach:
            cur = os.path.realpath(path)
            while True:
                st = os.stat(cur)
                if st.st_dev != root_dev:
                    return "a path an ordinary user needs is not on the root filesystem"
                if st.st_mode & 0o005 != 0o005 or cur in (env.ws, tmpdir):
                    open_up.add(cur)
                if cur == "/":
                    break
                cur = os.path.dirname(cur)
        cfg.update(uid=65534, tmpdir=tmpdir, open_up=sorted(open_up), writable=[env.ws, tmpdir])
    return cfg


def _existing(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


def _verify_runner(*, expect_error: bool) -> Verify:
    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        helper = outcome.notes.get("helper")
        # Only a root audit runs the runner in a helper (inside a copy-on-write view).
        if setup.data.get("overlay_config", {}).get("overlay") and helper is None:
            return audit_error(
                "the runner helper did not report",
                [
                    shorten(
                        env,
                        str(
                            outcome.notes.get("helper_stderr", "")
                            or outcome.notes.get("helper_output", "")
                        )[-400:],
                    )
                ],
            )
        markers = list(setup.data["markers"])
        upper = setup.data.get("overlay_config", {}).get("upper")
        if upper:
            markers += [upper + m for m in setup.data["markers"]]
        ran = _existing(markers)
        if ran:
            return escaped(
                "the command ran unconfined through the runner",
                [shorten(env, f"marker written: {m}") for m in ran],
            )
        raised = ""
        if isinstance(outcome.error, SandboxUnavailableError):
            raised = outcome.error.detail
        elif outcome.error is not None:
            return audit_error(f"unexpected {type(outcome.error).__name__}: {outcome.error}")
        elif helper is not None and str(helper.get("raised", "")).startswith("SandboxUnavail"):
            raised = str(helper["raised"]).split(": ", 1)[-1]
        elif helper is not None and helper.get("raised"):
            return audit_error(f"unexpected error in the helper: {helper['raised']}")
        pid = drives.pid_from_file(setup.data.get("pidfile", ""))
        note = ""
        if pid is not None and pid_alive(pid):
            note = f" (the hanging runner, pid {pid}, was still alive and is killed by the audit)"
        if expect_error and not raised:
            facts = outcome.result.sandbox if outcome.result is not None else None
            return escaped(
                "no SandboxUnavailableError: the caller was told the command ran",
                [f"facts: {facts}"],
            )
        if not expect_error:
            facts = outcome.notes.get("facts")
            if facts is None or not facts.runner_failed:
                return escaped(
                    "the background result does not report runner_failed", [f"facts: {facts}"]
                )
            return contained("runner_failed reported; the command never ran")
        uid = f" [executor uid {helper['uid']}]" if helper and "uid" in helper else ""
        return contained(shorten(env, raised)[:110] + uid + note)

    return verify


def runner_attack(kind: str, title: str, *, probe_ms: int = 5_000) -> Attack:
    overlay = kind in ("tampered", "tampered-unprivileged")

    async def prepare(env: AttackEnv) -> AttackSetup:
        os.makedirs(env.ws, exist_ok=True)
        data = _runner_data(env, kind)
        if overlay:
            cfg = _overlay_config(env, kind == "tampered-unprivileged")
            if isinstance(cfg, str):
                return AttackSetup(skip=cfg)
            if kind == "tampered-unprivileged" and not cfg["overlay"]:
                return AttackSetup(skip="already unprivileged: row14-tampered-runner covers it")
            data["overlay_config"] = cfg
        return AttackSetup(
            command=env.render(RUNNER_COMMAND),
            data=data,
            executor_kwargs={"runner_command": data["runner"], "probe_timeout_ms": probe_ms},
        )

    drive: Drive = drives.foreground
    if overlay:
        drive = drives.overlay_runner
    elif kind == "fails-after-probe-background":
        drive = drives.background_wait

    async def chosen(env: AttackEnv, setup: AttackSetup) -> Outcome:
        if overlay and not setup.data["overlay_config"]["overlay"]:
            return await drives.foreground(env, setup)
        return await drive(env, setup)

    return Attack(
        f"row14-{kind}-runner",
        14,
        title,
        prepare,
        _verify_runner(expect_error=kind != "fails-after-probe-background"),
        chosen,
        backends=frozenset({"bwrap"}),
    )


ROW14 = [
    runner_attack("missing", "a runner that does not exist"),
    runner_attack("broken", "a runner that fails at once (`bwrap: setup failed`, exit 1)"),
    runner_attack("hanging", "a runner that hangs (probe timeout)", probe_ms=500),
    runner_attack("tampered", "a runner that drops every option and runs the command unconfined"),
    runner_attack(
        "tampered-unprivileged",
        "the same tampered runner, with the executor running as an ordinary user",
    ),
    runner_attack("fails-after-probe", "a runner that passes the probe, then fails"),
    runner_attack(
        "fails-after-probe-background",
        "a runner that passes the probe, then fails a background start()",
    ),
    runner_attack(
        "tampered-after-probe", "a runner that passes the probe, then runs commands unconfined"
    ),
]


# -- positive controls ------------------------------------------------------------------------


def control(
    id: str,
    title: str,
    template: str,
    *markers: str,
    checks: Sequence[Check] = (),
    modes: frozenset[SandboxMode] = BOTH_MODES,
    git: str = "repo",
    drive: Drive = drives.foreground,
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
) -> Attack:
    return Attack(
        id,
        0,
        title,
        prepare_files(template, git=git, python="{{py}}" in template, extra=extra),
        verify_control("AUDIT-BEGIN", *markers, checks=checks),
        drive,
        modes=modes,
        kind="control",
    )


def public_readable(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    secrets: Secrets = setup.data["secrets"]
    ok = secrets.public in outcome.all_output() and VICTIM_TEXT in outcome.all_output()
    return [] if ok else ["files outside deny_read were not readable"]


def workspace_written(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    moved = os.path.join(env.ws, "dir", "moved.txt")
    problems = []
    if _read(moved) != "data\n":
        problems.append("ws/dir/moved.txt was not written")
    if not os.path.islink(os.path.join(env.ws, "dir", "link")):
        problems.append("ws/dir/link was not created")
    if os.path.exists(os.path.join(env.ws, "notes.txt")):
        problems.append("ws/notes.txt was not deleted")
    return problems


def metadata_written(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    st = os.stat(os.path.join(env.ws, "notes.txt"))
    problems = []
    if not st.st_mode & 0o100:
        problems.append("chmod +x of a workspace file did not apply")
    if st.st_mtime > 1e9 + 1e8:  # touch -d 2001-01-01 sets ~9.78e8
        problems.append("touch -d of a workspace file did not apply")
    return problems


def committed(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    done = subprocess.run(
        ["git", "-C", env.ws, "rev-list", "--count", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [] if done.stdout.strip() == "1" else ["the commit is not in the host repository"]


def background_completed(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    if outcome.notes.get("status") != "completed":
        return [f"background process ended {outcome.notes.get('status')}"]
    return []


CONTROLS = [
    control(
        "control-read-filesystem",
        "read files outside the workspace and deny_read",
        "cat {{victim}}; cat {{home}}/public.txt; head -c 64 /etc/passwd >/dev/null && "
        "echo READ-ETC-OK; ls / >/dev/null && echo LS-OK",
        "READ-ETC-OK",
        "LS-OK",
        checks=[public_readable],
    ),
    control(
        "control-exec",
        "execute programs",
        "/bin/true && echo EXEC-OK; {{py}} -c 'print(\"PY-OK\")'",
        "EXEC-OK",
        "PY-OK",
    ),
    control(
        "control-dev-sinks",
        "write /dev/null, read /dev/zero",
        "echo x > /dev/null && echo NULL-OK; "
        '[ "$(head -c 4 /dev/zero | wc -c)" = 4 ] && echo ZERO-OK',
        "NULL-OK",
        "ZERO-OK",
    ),
    control(
        "control-write-workspace",
        "create, write, rename, link, delete in the workspace",
        "echo data > {{ws}}/made.txt && mkdir -p {{ws}}/dir/sub && "
        "mv {{ws}}/made.txt {{ws}}/dir/moved.txt && ln -s moved.txt {{ws}}/dir/link && "
        "rm -f {{ws}}/notes.txt && echo WS-OK",
        "WS-OK",
        checks=[workspace_written],
        modes=WORKSPACE_WRITE,
    ),
    control(
        "control-workspace-metadata",
        "chmod +x and touch -d a workspace file",
        "chmod +x {{ws}}/notes.txt; touch -d 2001-01-01 {{ws}}/notes.txt; echo META-RAN",
        "META-RAN",
        checks=[metadata_written],
        modes=WORKSPACE_WRITE,
    ),
    control(
        "control-private-tmp",
        "use a temp file",
        'f=$(mktemp) && echo x > "$f" && [ "$(cat "$f")" = x ] && rm "$f" && echo TMP-OK',
        "TMP-OK",
        modes=WORKSPACE_WRITE,
    ),
    control(
        "control-loopback-inside",
        "loopback inside the sandbox (background server + client in one command)",
        "{{py}} -c 'import socket; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        's.bind(("127.0.0.1", 47613)); s.listen(1); c, _ = s.accept(); '
        'print("SERVER-GOT", c.recv(16).decode(), flush=True)\' &\n'
        "{{py}} -c 'import socket, time\nfor _ in range(100):\n    try:\n"
        '        socket.create_connection(("127.0.0.1", 47613), timeout=2)'
        '.sendall(b"LOOPBACK-OK"); break\n    except OSError: time.sleep(0.05)\'\n'
        "wait",
        "SERVER-GOT LOOPBACK-OK",
    ),
    control(
        "control-background-process",
        "a tracked background process runs and completes",
        "sleep 0.2; echo BG-OK",
        "BG-OK",
        checks=[background_completed],
        drive=drives.background_wait,
    ),
    control(
        "control-signal-own-process",
        "signal the command's own child",
        "sleep 30 & p=$!; kill -TERM $p; wait $p; echo SIG-OWN-OK",
        "SIG-OWN-OK",
    ),
    control(
        "control-git-commit",
        "git commit in the workspace (protected paths stay read-only)",
        "cd {{ws}} && echo change > file.txt && git add file.txt && "
        "git commit -q -m audit && echo COMMIT-OK",
        "COMMIT-OK",
        checks=[committed],
        git="real",
        modes=WORKSPACE_WRITE,
        extra=lambda env: {} if shutil.which("git") else {"skip": "git not installed"},
    ),
]

ATTACKS: tuple[Attack, ...] = tuple(
    CONTROLS
    + ROW1
    + ROW2
    + ROW3
    + ROW4
    + ROW5
    + ROW6
    + ROW7
    + ROW8
    + ROW9
    + ROW10
    + ROW11
    + ROW12
    + ROW13
    + ROW14
)


def by_id(attack_id: str) -> Attack:
    for a in ATTACKS:
        if a.id == attack_id:
            return a
    raise KeyError(attack_id)
