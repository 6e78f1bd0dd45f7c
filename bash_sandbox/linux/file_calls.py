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
    """Where a call keeps its arguments (indexes into the six syscall arguments), and what
    it does: ``setid`` calls can give a file a mode, ``write`` names the kind of change
    for the write watch (`write_watch.py`)."""

    name: str
    path: int | None = None  # the path pointer
    dirfd: int | None = None  # the directory a relative path starts from (None: the cwd)
    path2: int | None = None  # the second path (rename, link: the new name)
    dirfd2: int | None = None
    fd: int | None = None  # the file itself, for fd-based calls
    mode: int | None = None
    flags: int | None = None  # open flags; None for calls that always create (creat)
    xattr: int | None = None  # the xattr name pointer
    # "open", "create", "remove", "rename", "link", "truncate", "attr" (a mode or owner)
    write: str | None = None


# Calls that give a file a mode (the kernel keeps S_ISUID/S_ISGID from it) or an xattr.
# mkdir is absent on purpose: the kernel masks its mode to 0777|S_ISVTX (vfs_prepare_mode),
# so a directory gets a set-id bit only by chmod or from its parent, never from mkdir.
MODE_CALLS = (
    FileCall("chmod", path=0, mode=1, write="attr"),
    FileCall("fchmod", fd=0, mode=1),
    FileCall("fchmodat", dirfd=0, path=1, mode=2, write="attr"),
    FileCall("fchmodat2", dirfd=0, path=1, mode=2, write="attr"),
    FileCall("open", path=0, flags=1, mode=2, write="open"),
    FileCall("openat", dirfd=0, path=1, flags=2, mode=3, write="open"),
    FileCall("creat", path=0, mode=1, write="open"),
    FileCall("mknod", path=0, mode=1, write="create"),
    FileCall("mknodat", dirfd=0, path=1, mode=2, write="create"),
)
XATTR_CALLS = (
    FileCall("setxattr", path=0, xattr=1),
    FileCall("lsetxattr", path=0, xattr=1),
    FileCall("fsetxattr", fd=0, xattr=1),
    FileCall("setxattrat", dirfd=0, path=1, xattr=3),
)
# Calls that change the tree, watched whole (opens only with a write flag, in BPF).
WRITE_CALLS = (
    FileCall("mkdir", path=0, write="create"),
    FileCall("mkdirat", dirfd=0, path=1, write="create"),
    FileCall("symlink", path=1, write="create"),
    FileCall("symlinkat", dirfd=1, path=2, write="create"),
    FileCall("rmdir", path=0, write="remove"),
    FileCall("unlink", path=0, write="remove"),
    FileCall("unlinkat", dirfd=0, path=1, write="remove"),
    FileCall("rename", path=0, path2=1, write="rename"),
    FileCall("renameat", dirfd=0, path=1, dirfd2=2, path2=3, write="rename"),
    FileCall("renameat2", dirfd=0, path=1, dirfd2=2, path2=3, write="rename"),
    FileCall("link", path=0, path2=1, write="link"),
    FileCall("linkat", dirfd=0, path=1, dirfd2=2, path2=3, write="link"),
    FileCall("truncate", path=0, write="truncate"),
    # A mode or owner refused on a read-only mount is a refusal too (it was a hint read
    # from the output at best: a red team's). By path only: a descriptor's file was
    # opened, and an open for writing is judged already.
    FileCall("chown", path=0, write="attr"),
    FileCall("lchown", path=0, write="attr"),
    FileCall("fchownat", dirfd=0, path=1, write="attr"),
)
O_WRONLY = 0o1
O_RDWR = 0o2
O_TRUNC = 0o1000
O_EXCL = 0o200
O_NOFOLLOW = 0o400000
# Any of these in the open flags is a write intent (O_TMPFILE needs O_WRONLY or O_RDWR).
WRITE_OPEN_BITS = (O_WRONLY, O_RDWR, O_CREAT, O_TRUNC)

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
        "truncate": 76,
        "rename": 82,
        "mkdir": 83,
        "rmdir": 84,
        "link": 86,
        "unlink": 87,
        "symlink": 88,
        "mkdirat": 258,
        "unlinkat": 263,
        "renameat": 264,
        "linkat": 265,
        "symlinkat": 266,
        "renameat2": 316,
        "chown": 92,
        "lchown": 94,
        "fchownat": 260,
    },
    "aarch64": {
        "setxattr": 5,
        "lsetxattr": 6,
        "fsetxattr": 7,
        "mknodat": 33,
        "fchmod": 52,
        "fchmodat": 53,
        "openat": 56,
        "mkdirat": 34,
        "unlinkat": 35,
        "symlinkat": 36,
        "linkat": 37,
        "renameat": 38,
        "truncate": 45,
        "renameat2": 276,
        "fchownat": 54,
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
    calls = MODE_CALLS + XATTR_CALLS + WRITE_CALLS
    return {numbers[c.name]: c for c in calls if c.name in numbers}
