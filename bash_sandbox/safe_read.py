"""Reading a small file a command may have made, without letting it stall or steer the read.

The executor reads files inside the writable roots on its own loop (a repository's `HEAD`,
a `.git` file, a hook manager's config, an `.envrc`). A plain `open` of a FIFO a command left
there waits for a writer that never comes: the loop stopped, and with it every timeout,
signal and `aclose()` of the executor (a red team's `mkfifo r/.git/HEAD`). A link to a
device would have the executor open the device (as root, a watchdog). So the name is opened
with `O_PATH` (which opens no FIFO or device), its kind read from that descriptor, and only a
regular file is opened for reading, through the same descriptor (so it is that very file).
Anything else is `NotRegularFileError`, an `OSError` that the callers' "cannot read it"
paths already take.
"""

from __future__ import annotations

import errno
import os
import stat


class NotRegularFileError(OSError):
    """The name is not a regular file (a FIFO, socket, device or directory)."""


def read_regular(path: str, limit: int, *, follow: bool = True) -> bytes:
    """Up to ``limit`` bytes of the regular file ``path`` (``follow``: through a symlink,
    as git and the tools reading it would)."""
    if not hasattr(os, "O_PATH"):  # macOS: the kind looked at first, then a non-blocking open
        return _read_checked(path, limit, follow)
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    held = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(held).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", path)
        fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(held)
    return _read_all(fd, limit)


def _read_checked(path: str, limit: int, follow: bool) -> bytes:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    st = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(errno.EINVAL, "not a regular file", path)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, "not a regular file", path)
    return _read_all(fd, limit)


def _read_all(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``, which is closed."""
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_small_text(path: str) -> str | None:
    """The first 4 KiB of the regular file ``path`` as text; None when it cannot be read."""
    try:
        return read_regular(path, 4096).decode(errors="replace")
    except OSError:
        return None


def is_special(mode: int) -> bool:
    """A FIFO, socket or device: opening one may wait forever or act on the device."""
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def blocking_names(gitdir: str) -> list[str]:
    """The names git reads at the start of almost every command in ``gitdir`` (and each
    loose ref) that are FIFOs, sockets or devices: host git run there would stall on one
    until its time bound (a repository a running command is making). Bounded."""
    names = [os.path.join(gitdir, n) for n in _GIT_READS]
    pending = [os.path.join(gitdir, "refs")]
    while pending and len(names) < _REFS_MAX:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    names.append(entry.path)
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError:
            continue
    found: list[str] = []
    for name in names:
        try:
            mode = os.stat(name).st_mode  # stat opens nothing, a FIFO included
        except OSError:
            continue
        if is_special(mode):
            found.append(name)
    return found


_GIT_READS = ("HEAD", "config", "config.worktree", "commondir", "packed-refs", "index")
_REFS_MAX = 4096


def open_below(fd: int, rel: str) -> int:
    """A descriptor of the directory ``rel`` below the directory ``fd``, no component
    followed as a link (a command may have swapped one for a link out of the roots)."""
    cur = os.dup(fd)
    try:
        for part in rel.split("/") if rel else ():
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            nxt = os.open(part, flags, dir_fd=cur)
            os.close(cur)
            cur = nxt
    except BaseException:
        os.close(cur)
        raise
    return cur
