"""The seccomp filter of confined commands: a pure rule list, compiled by libseccomp.

Landlock and mount namespaces decide *where* a command may write; seccomp closes what they
cannot see: terminal injection, new user namespaces (the door to capabilities and mounts),
kernel keyrings, io_uring (syscalls seccomp cannot inspect), and unix sockets under an
isolated network.
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile
from dataclasses import dataclass

log = logging.getLogger("bash_sandbox")

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
CLONE_NEWUSER = 0x10000000
AF_UNIX = 1
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ArgCheck:
    """`(arg[index] & mask) == value`; `op="ne"` matches `arg[index] != value`."""

    index: int
    value: int
    mask: int = _U32
    op: str = "masked_eq"


@dataclass(frozen=True)
class SeccompRule:
    syscall: str
    errno: int
    args: tuple[ArgCheck, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class SeccompOptions:
    """What this command's filter must refuse beyond the always-on set."""

    block_unix_sockets: bool = False
    # Landlock without a mount namespace: nothing else stops chmod/chown/utimes outside roots.
    block_metadata: bool = False


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
        SeccompRule(
            "unshare", eperm, (ArgCheck(0, CLONE_NEWUSER, CLONE_NEWUSER),), "no new user namespace"
        ),
        SeccompRule(
            "clone", eperm, (ArgCheck(0, CLONE_NEWUSER, CLONE_NEWUSER),), "no new user namespace"
        ),
        # clone3 passes flags in memory seccomp cannot read; ENOSYS makes libc fall back to clone.
        SeccompRule("clone3", errno.ENOSYS, (), "flags not inspectable"),
    ]
    rules += [SeccompRule(name, eperm, (), "no mounts") for name in _MOUNT_CALLS]
    rules += [SeccompRule(name, eperm, (), "no shared keyrings") for name in _KEYRING_CALLS]
    rules += [SeccompRule(name, eperm, (), "no kernel-global state") for name in _KERNEL_CALLS]
    rules += [
        SeccompRule(name, errno.ENOSYS, (), "not inspectable by seccomp")
        for name in _IO_URING_CALLS
    ]
    if options.block_unix_sockets:
        rules.append(
            SeccompRule(
                "socket",
                eperm,
                (ArgCheck(0, AF_UNIX),),
                "no host unix sockets under an isolated network",
            )
        )
    if options.block_metadata:
        rules += [
            SeccompRule(name, eperm, (), "metadata outside the roots, unscoped here")
            for name in _METADATA_CALLS
        ]
    return tuple(rules)


@functools.lru_cache(maxsize=8)
def compile_seccomp(options: SeccompOptions) -> bytes:
    """Classic BPF for the native architecture; other architectures' syscalls are killed."""
    import pyseccomp

    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    ops = {"masked_eq": pyseccomp.MASKED_EQ, "ne": pyseccomp.NE}
    for rule in render_seccomp_rules(options):
        args = []
        for a in rule.args:
            if a.op == "masked_eq":
                args.append(pyseccomp.Arg(a.index, ops[a.op], a.mask, a.value))
            else:
                args.append(pyseccomp.Arg(a.index, ops[a.op], a.value))
        try:
            flt.add_rule(pyseccomp.ERRNO(rule.errno), rule.syscall, *args)
        except (OSError, ValueError) as exc:
            # A syscall this libseccomp/arch does not know cannot be called here either.
            log.debug("seccomp: skipping %s: %s", rule.syscall, exc)
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()
