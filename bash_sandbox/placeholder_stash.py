"""Empty directories kept for placeholders, moved in and out of the workspace by rename.

A spawn in a writable root makes a directory placeholder for each missing auto-run name (16
by default) and removes them after the command. On a filesystem mounted with `discard` (as
virtual machines' disks often are) `rmdir` frees the directory's block and waits for the
device: 70 us each here, against 10 us for a rename. So a released placeholder is renamed
into the executor's private stash (`<state>/placeholder-stash`, 0700, gone with the executor)
and the next placeholder is renamed out of it, both with `RENAME_NOREPLACE`, never over an
existing name. The stash is used only under the placeholder ledger's lock
(`placeholders.py`), so one process at a time.

A stash entry moves into the workspace with its mtime set to the ledger's intent time, so a
kill between the move and the ledger's record is recognised as ours (`placeholders._untouched`).
A directory that something wrote into between the emptiness check and the move out is moved
back where it was (or beside it, if that name was made meanwhile), never kept: the stash only
ever hands out an empty directory. Where the stash cannot serve (another filesystem, no
`renameat2`), placeholders are made and removed as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
from collections.abc import Callable
from typing import cast

STASH_DIR = "placeholder-stash"
STASH_MAX = 64  # directories kept; more are removed
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None  # not glibc 2.28+ (or not Linux)
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return cast(Callable[[int, bytes, int, bytes, int], int], func)


_RENAME = _renameat2()


def move_noreplace(src: str, dst: str) -> None:
    """rename(2) that fails with EEXIST where ``dst`` exists (even an empty directory)."""
    if _RENAME is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", dst)
    if _RENAME(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


class Stash:
    """One executor's stash (the directory ``path``), for one ledger transaction."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._names: list[str] | None = None
        self._device: int | None = None
        self._parents: dict[str, bool] = {}  # a parent's answer, once per transaction

    def _entries(self) -> list[str] | None:
        """The stashed names (listed once per transaction); None where there is no stash."""
        if self._names is None:
            if _RENAME is None:
                return None
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.path, 0o700)
                st = os.lstat(self.path)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                    return None
                self._device = st.st_dev
                self._names = os.listdir(self.path)
            except OSError:
                return None
        return self._names

    def _serves(self, path: str) -> bool:
        """Whether a rename between the stash and ``path`` can work (one filesystem)."""
        names = self._entries()
        if names is None:
            return False
        parent = os.path.dirname(path)
        known = self._parents.get(parent)
        if known is None:
            try:
                known = os.lstat(parent).st_dev == self._device
            except OSError:
                known = False
            self._parents[parent] = known
        return known

    def take(self, path: str, mtime_ns: int) -> bool:
        """Move an empty stashed directory to ``path`` with ``mtime_ns``; False when none
        can be (then the caller makes one). Raises FileExistsError when ``path`` exists."""
        if not self._serves(path):
            return False
        names = self._entries() or []
        while names:
            entry = os.path.join(self.path, names.pop())
            try:
                if os.listdir(entry):
                    continue  # never handed out with something in it
                os.utime(entry, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
                move_noreplace(entry, path)
            except FileExistsError:
                raise
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    self._names = []  # another mount of the filesystem: not from here
                    return False
                continue
            return True
        return False

    def put(self, path: str) -> bool:
        """Move the empty placeholder directory ``path`` into the stash; False when it was
        not moved (the caller removes it)."""
        names = self._entries()
        if names is None or len(names) >= STASH_MAX or not self._serves(path):
            return False
        name = secrets.token_hex(8)
        entry = os.path.join(self.path, name)
        try:
            move_noreplace(path, entry)
        except OSError:
            return False
        try:
            written = bool(os.listdir(entry))
        except OSError:
            written = True
        if written:
            self._give_back(entry, path)
            return True  # not a placeholder any more: the caller forgets it
        names.append(name)
        return True

    @staticmethod
    def _give_back(entry: str, path: str) -> None:
        """A directory written into between the check and the move: back where it was, or
        beside it when that name was made meanwhile."""
        for target in (path, f"{path}.bash-sandbox-{secrets.token_hex(4)}"):
            try:
                move_noreplace(entry, target)
                return
            except OSError:
                continue
