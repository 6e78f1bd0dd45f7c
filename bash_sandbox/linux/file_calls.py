"""The file syscalls the supervised filter hands over: their numbers and argument layout.

One table serves both sides: `seccomp.py` builds BPF rules on the argument *values* it can
test (a mode, open flags), and the supervisor reads the *pointers* (a path, an xattr name)
from the command's memory. Numbers are per architecture; calls newer than the system's
libseccomp (``setxattrat``) are added by number, since a rule libseccomp cannot name would
otherwise be skipped and the call left open.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

S_ISUID = 0o4000
S_ISGID = 0o2000
SETID_BITS = (S_ISUID, S_ISGID)
O_CREAT = 0o100
# The kernel's __O_TMPFILE: an unnamed file, created with the mode, linkable later.
O_TMPFILE_BIT = 0o20000000
XATTR_CAPS = b"security.capability"
XATTR_NAME_MAX = 255


@dataclass(frozen=True)
class FileCall:
    """Where a call keeps its arguments: indexes into the six syscall arguments."""

    name: str
    path: int | None = None  # the path pointer
    dirfd: int | None = None  # the directory a relative path starts from (None: the cwd)
    fd: int | None = None  # the file itself, for fd-based calls
    mode: int | None = None
    flags: int | None = None  # open flags; None for calls that always create (creat)
    xattr: int | None = None  # the xattr name pointer


# Calls that give a file a mode (the kernel keeps S_ISUID/S_ISGID from it) or an xattr.
# mkdir is absent on purpose: the kernel masks its mode to 0777|S_ISVTX (vfs_prepare_mode),
# so a directory gets a set-id bit only by chmod or from its parent, never from mkdir.
MODE_CALLS = (
    FileCall("chmod", path=0, mode=1),
    FileCall("fchmod", fd=0, mode=1),
    FileCall("fchmodat", dirfd=0, path=1, mode=2),
    FileCall("fchmodat2", dirfd=0, path=1, mode=2),
    FileCall("open", path=0, flags=1, mode=2),
    FileCall("openat", dirfd=0, path=1, flags=2, mode=3),
    FileCall("creat", path=0, mode=1),
    FileCall("mknod", path=0, mode=1),
    FileCall("mknodat", dirfd=0, path=1, mode=2),
)
XATTR_CALLS = (
    FileCall("setxattr", path=0, xattr=1),
    FileCall("lsetxattr", path=0, xattr=1),
    FileCall("fsetxattr", fd=0, xattr=1),
    FileCall("setxattrat", dirfd=0, path=1, xattr=3),
)

# Native numbers (x86_64's own table; aarch64 uses the generic one, without the legacy
# path calls). Calls from 424 on share one number on every architecture.
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "open": 2,
        "creat": 85,
        "chmod": 90,
        "fchmod": 91,
        "mknod": 133,
        "setxattr": 188,
        "lsetxattr": 189,
        "fsetxattr": 190,
        "openat": 257,
        "mknodat": 259,
        "fchmodat": 268,
    },
    "aarch64": {
        "setxattr": 5,
        "lsetxattr": 6,
        "fsetxattr": 7,
        "mknodat": 33,
        "fchmod": 52,
        "fchmodat": 53,
        "openat": 56,
    },
}
_UNIFIED = {
    "open_tree_attr": 467,
    "openat2": 437,
    "fchmodat2": 452,
    "setxattrat": 463,
    "removexattrat": 466,
}


def syscall_numbers(machine: str | None = None) -> dict[str, int]:
    """name -> number on ``machine`` (this one by default); empty for other machines."""
    machine = machine or os.uname().machine
    table = _NUMBERS.get(machine)
    return {} if table is None else {**table, **_UNIFIED}


def by_number(machine: str | None = None) -> dict[int, FileCall]:
    """number -> layout, for the supervisor's dispatch."""
    numbers = syscall_numbers(machine)
    return {numbers[c.name]: c for c in MODE_CALLS + XATTR_CALLS if c.name in numbers}
