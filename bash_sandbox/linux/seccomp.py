"""The seccomp filters of confined commands: pure rule lists, compiled by libseccomp.

Landlock and mount namespaces decide *where* a command may write; seccomp closes what they
cannot see. Two filters, both installed on every confined command:

- the *refusal* filter (`render_seccomp_rules`): terminal injection, new user namespaces
  (the door to capabilities and mounts), mounts, kernel keyrings and global knobs, io_uring
  (its operations are invisible to seccomp); each refused with an errno;
- the *supervised* filter (`render_notify_rules`): calls handed to the executor's supervisor
  (`supervisor.py`) as user notifications. Every `connect()` (a pathname unix socket is
  reached by path, which no mount or Landlock rule of this kernel refuses, so the
  supervisor resolves the path in the command's own view and connects only to sockets the
  command may reach), and every socket family or type outside the list commands need:
  AF_UNIX stream and seqpacket (a datagram or raw unix socket could `sendto()` any path,
  bypassing connect), AF_INET and AF_INET6 (UDP and TCP; raw needs a capability nobody
  has), AF_NETLINK with NETLINK_ROUTE only (resolvers and `ip` ask for addresses). The
  supervisor refuses those and records each as a denial: the kernel saw it, not the text.
  And every call that would give a file a set-user-ID or set-group-ID bit (`chmod` family,
  `open`/`creat` with O_CREAT or O_TMPFILE, `mknod`), tested in BPF on the mode argument so
  only those calls trap, plus every `setxattr` (the name is a pointer BPF cannot read; the
  supervisor reads it and refuses `security.capability`). A set-id or capability-bearing
  file would outlive the command: anyone who later runs it from the host gets the
  executor's user. `openat2` passes its mode in memory, so it is answered ENOSYS (callers
  fall back to `openat`, which the filter inspects).
  And, for the write watch (`write_watch.py`), every call that changes the tree: opens only
  with a write flag (O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, tested in BPF, so reads and exec
  never trap), mkdir, mknod, symlink, link, rename, unlink, rmdir, truncate. The supervisor
  lets those continue; it only records the ones the command's view refuses.
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile
from dataclasses import dataclass
from typing import Literal

from bash_sandbox.linux.file_calls import (
    MODE_CALLS,
    O_CREAT,
    O_TMPFILE_BIT,
    SETID_BITS,
    WRITE_CALLS,
    WRITE_OPEN_BITS,
    XATTR_CALLS,
    syscall_numbers,
)

log = logging.getLogger("bash_sandbox")

# The write watch on (the default); a benchmark's baseline arm turns it off.
WATCH_WRITES = True

TIOCSTI = 0x5412
F_SETLEASE = 1024
TIOCLINUX = 0x541C
CLONE_NEWUSER = 0x10000000
AF_UNIX = 1
MSG_FASTOPEN = 0x20000000
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
AF_MAX = 46
SOCK_DGRAM = 2
SOCK_RAW = 3
SOCK_TYPE_MASK = 0xF
NETLINK_ROUTE = 0
ALLOWED_SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ArgCheck:
    """`(arg[index] & mask) == value`; `op="ne"` matches `arg[index] != value`."""

    index: int
    value: int
    mask: int = _U32
    op: Literal["masked_eq", "ne", "gt"] = "masked_eq"


@dataclass(frozen=True)
class SeccompRule:
    """``syscall`` matching every ``args`` check gets ``errno`` (None: a user notification)."""

    syscall: str
    errno: int | None
    args: tuple[ArgCheck, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class SeccompOptions:
    """What this command's filter must refuse beyond the always-on set."""

    # Landlock without a mount namespace: nothing else stops chmod/chown/utimes outside roots.
    block_metadata: bool = False
    # Landlock without a network namespace under `isolated`: a TCP Fast Open send connects
    # without connect() (neither Landlock's connect hook nor the supervisor sees it).
    block_fastopen: bool = False


_METADATA_CALLS = (
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "setxattrat",
    "removexattrat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
)
_MOUNT_CALLS = (
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_tree_attr",
)
_KEYRING_CALLS = ("keyctl", "add_key", "request_key")
_KERNEL_CALLS = (
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "syslog",
    "quotactl",
    "lookup_dcookie",
    "mq_open",
    "mq_unlink",
)
_IO_URING_CALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register")


def render_seccomp_rules(options: SeccompOptions) -> tuple[SeccompRule, ...]:
    """The complete deny list for ``options``, in a stable order (default action: allow)."""
    eperm = errno.EPERM
    rules: list[SeccompRule] = [
        SeccompRule("ioctl", eperm, (ArgCheck(1, TIOCSTI),), "no keystroke injection"),
        SeccompRule("ioctl", eperm, (ArgCheck(1, TIOCLINUX),), "no console injection"),
        # A lease needs only the file's owner: a command running as root leased root-owned
        # host files (read-only to it) and every host open of one waited 45 s (red team).
        SeccompRule("fcntl", eperm, (ArgCheck(1, F_SETLEASE),), "no leases on host files"),
        SeccompRule(
            "unshare", eperm, (ArgCheck(0, CLONE_NEWUSER, CLONE_NEWUSER),), "no new user namespace"
        ),
        SeccompRule(
            "clone", eperm, (ArgCheck(0, CLONE_NEWUSER, CLONE_NEWUSER),), "no new user namespace"
        ),
        # clone3 passes flags in memory seccomp cannot read; ENOSYS makes libc fall back to clone.
        SeccompRule("clone3", errno.ENOSYS, (), "flags not inspectable"),
        # openat2 passes flags and mode in memory; ENOSYS makes callers fall back to openat.
        SeccompRule("openat2", errno.ENOSYS, (), "mode not inspectable"),
    ]
    rules += [SeccompRule(name, eperm, (), "no mounts") for name in _MOUNT_CALLS]
    rules += [SeccompRule(name, eperm, (), "no shared keyrings") for name in _KEYRING_CALLS]
    rules += [SeccompRule(name, eperm, (), "no kernel-global state") for name in _KERNEL_CALLS]
    rules += [
        SeccompRule(name, errno.ENOSYS, (), "not inspectable by seccomp")
        for name in _IO_URING_CALLS
    ]
    if options.block_metadata:
        rules += [
            SeccompRule(name, eperm, (), "metadata outside the roots, unscoped here")
            for name in _METADATA_CALLS
        ]
    if options.block_fastopen:
        # sendto(fd, buf, len, flags, ...), sendmsg(fd, msg, flags), sendmmsg(fd, v, n, flags)
        rules += [
            SeccompRule(
                name,
                eperm,
                (ArgCheck(index, MSG_FASTOPEN, MSG_FASTOPEN),),
                "a TCP Fast Open send connects without connect()",
            )
            for name, index in (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3))
        ]
    return tuple(rules)


def render_notify_rules(watch_writes: bool = True) -> tuple[SeccompRule, ...]:
    """The supervised calls, in a stable order (default action: allow)."""
    rules = [SeccompRule("connect", None, (), "the supervisor checks every destination")]
    for call in ("socket", "socketpair"):
        rules += [
            SeccompRule(call, None, (ArgCheck(0, family),), "socket family outside the list")
            for family in range(AF_MAX)
            if family not in ALLOWED_SOCKET_FAMILIES
        ]
        rules.append(SeccompRule(call, None, (ArgCheck(0, AF_MAX - 1, op="gt"),), "unknown family"))
        rules += [
            SeccompRule(
                call,
                None,
                (ArgCheck(0, AF_UNIX), ArgCheck(1, kind, SOCK_TYPE_MASK)),
                "a unix datagram socket could sendto() any path",
            )
            for kind in (SOCK_DGRAM, SOCK_RAW)
        ]
    rules.append(
        SeccompRule(
            "socket",
            None,
            (ArgCheck(0, AF_NETLINK), ArgCheck(2, NETLINK_ROUTE, op="ne")),
            "netlink beyond routing",
        )
    )
    whole = _write_rules() if watch_writes else ()
    if watch_writes:
        # A unix socket's path is a file it makes (the family lies in memory: every bind).
        whole += (SeccompRule("bind", None, (), "a unix socket bound to a path"),)
    trapped = {r.syscall for r in whole if not r.args}
    return tuple(rules) + _setid_rules(trapped) + whole


def _write_rules() -> tuple[SeccompRule, ...]:
    rules: list[SeccompRule] = []
    for call in MODE_CALLS + WRITE_CALLS:
        if call.write is None:
            continue
        if call.flags is None:
            rules.append(SeccompRule(call.name, None, (), "a change to the tree"))
        else:
            rules += [
                SeccompRule(call.name, None, (ArgCheck(call.flags, bit, bit),), "write intent")
                for bit in WRITE_OPEN_BITS
            ]
    return tuple(rules)


def _setid_rules(trapped: set[str]) -> tuple[SeccompRule, ...]:
    """A set-id bit in a mode that reaches a file (a creating open only: without O_CREAT
    or O_TMPFILE the mode argument is ignored), and every xattr write. ``trapped``: calls
    the write watch already hands over whole."""
    rules: list[SeccompRule] = []
    for call in MODE_CALLS:
        if call.name in trapped:
            continue
        assert call.mode is not None
        creating = (
            ((),)
            if call.flags is None
            else ((ArgCheck(call.flags, O_CREAT, O_CREAT),),
                  (ArgCheck(call.flags, O_TMPFILE_BIT, O_TMPFILE_BIT),))
        )  # fmt: skip
        rules += [
            SeccompRule(call.name, None, (*when, ArgCheck(call.mode, bit, bit)), "set-id mode")
            for when in creating
            for bit in SETID_BITS
        ]
    rules += [SeccompRule(c.name, None, (), "the supervisor reads the name") for c in XATTR_CALLS]
    return tuple(rules)


def _compile(rules: tuple[SeccompRule, ...]) -> bytes:
    """Classic BPF for the native architecture; other architectures' syscalls are killed."""
    import pyseccomp

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    numbers = syscall_numbers()
    for rule in rules:
        args = []
        for a in rule.args:
            if a.op == "masked_eq":
                args.append(pyseccomp.Arg(a.index, pyseccomp.MASKED_EQ, a.mask, a.value))
            elif a.op == "ne":
                args.append(pyseccomp.Arg(a.index, pyseccomp.NE, a.value))
            else:
                args.append(pyseccomp.Arg(a.index, pyseccomp.GT, a.value))
        action = pyseccomp.NOTIFY if rule.errno is None else pyseccomp.ERRNO(rule.errno)
        syscall: int | str = rule.syscall
        if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, rule.syscall) < 0:
            # Newer than this libseccomp: by number, or a call the kernel may have stays open.
            syscall = numbers.get(rule.syscall, rule.syscall)
        try:
            flt.add_rule(action, syscall, *args)
        except (OSError, ValueError) as exc:
            # A syscall this libseccomp/arch does not know cannot be called here either.
            log.debug("seccomp: skipping %s: %s", rule.syscall, exc)
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()


@functools.lru_cache(maxsize=8)
def compile_seccomp(options: SeccompOptions) -> bytes:
    """The refusal filter for ``options`` as BPF."""
    return _compile(render_seccomp_rules(options))


def compile_notify_filter() -> bytes:
    """The supervised filter as BPF (installed with a user-notification listener)."""
    return _compile_notify(WATCH_WRITES)


@functools.lru_cache(maxsize=2)
def _compile_notify(watch_writes: bool) -> bytes:
    return _compile(render_notify_rules(watch_writes))
