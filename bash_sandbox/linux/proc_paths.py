"""What a trapped file call names, as the command sees it: strings read from its memory,
relative paths joined to its working directory or directory descriptor at the time of the
call (`/proc/<pid>/cwd`, `/proc/<pid>/fd/<n>`), never to the directory it started in.

The links are read from the executor, so they show the command's mount namespace as seen
from outside: paths inside the command's own view (the same paths the command used).
"""

from __future__ import annotations

import os
from collections.abc import Callable

AT_FDCWD = -100
PATH_MAX = 4096
_PAGE = 4096

MemoryReader = Callable[[int, int, int], "bytes | None"]


def read_cstring(read: MemoryReader, pid: int, address: int, limit: int) -> bytes | None:
    """The NUL-terminated string at ``address`` (at most ``limit`` bytes), read a page at a
    time so an unmapped page after a short string is never touched; None when unreadable."""
    out = b""
    while len(out) < limit:
        # Most paths are short: a small first read, then up to each page's end.
        chunk = min(limit - len(out), _PAGE - (address % _PAGE), 256 if not out else _PAGE)
        data = read(pid, address, chunk)
        if not data:
            return None
        end = data.find(b"\0")
        if end >= 0:
            return out + data[:end]
        out += data
        address += len(data)
    return None  # longer than the kernel accepts: it answers ENAMETOOLONG itself


def _link(path: str) -> str | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return None if target.endswith(" (deleted)") or not target.startswith("/") else target


def fd_path(pid: int, fd: int) -> str | None:
    """What descriptor ``fd`` of ``pid`` points at, None for a socket, pipe or closed fd."""
    return _link(f"/proc/{pid}/fd/{fd}")


def call_path(pid: int, dirfd: int | None, path: bytes) -> str | None:
    """``path`` made absolute against ``dirfd`` (AT_FDCWD or None: the cwd) of ``pid``,
    lexically normalised but for `..`, which the kernel takes after following a link (`l/..`
    is the link target's parent: normalised away, a red team named `/etc/x` for a write that
    landed in the workspace, and hid a refused one); None when the base is gone."""
    name = os.fsdecode(path)
    if not name.startswith("/"):
        at_cwd = dirfd is None or dirfd == AT_FDCWD
        base = _link(f"/proc/{pid}/cwd") if at_cwd else fd_path(pid, dirfd)  # type: ignore[arg-type]
        if base is None:
            return None
        if not name:
            return base
        name = os.path.join(base, name)
    if ".." not in name.split("/"):
        return os.path.normpath(name)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def signed_int(value: int) -> int:
    """A syscall's int argument (a dirfd) from its 64-bit register."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value
