"""Symbolic links in a writable root that a host name leads through, put back after a command.

A home name can reach a root through a link that lies *in* the root (a dotfiles tree:
`~/.ssh -> dotfiles/ssh`, `dotfiles/ssh -> ssh-real`, the workspace `~/dotfiles`). No mount
can hold a link (a mount point is never a link), so a command can re-point it in one rename,
and host ssh then reads the command's directory as `~/.ssh` (a red team's). The run says so
(`partial`), the cover watch stops the command when it happens, and after the command each
such link is put back as the spawn found it: whatever the command left there is moved aside
beside it (never deleted: it may hold the user's work), never followed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat


def snapshot_links(paths: list[str]) -> tuple[tuple[str, str], ...]:
    """(path, target) of each of ``paths`` that is a symbolic link now."""
    found: list[tuple[str, str]] = []
    for path in paths:
        with contextlib.suppress(OSError):
            found.append((path, os.readlink(path)))
    return tuple(found)


def put_back(path: str, value: str) -> str | None:
    """Make ``path`` the link to ``value`` it was, if the command changed it; a warning
    naming what was done, or None (unchanged, or it could not be done: then named too)."""
    directory, name = os.path.split(path)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"could not put back the link {path} (its directory: {exc.strerror})"
    try:
        try:
            st: os.stat_result | None = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            st = None
        if (
            st is not None
            and stat.S_ISLNK(st.st_mode)
            and os.readlink(name, dir_fd=dir_fd) == value
        ):
            return None
        aside = ""
        if st is not None and stat.S_ISDIR(st.st_mode):
            # A directory cannot be renamed over: moved beside it, the user's to look at.
            aside = f"{name}.bash-sandbox-{secrets.token_hex(4)}"
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = f".{name}.bash-sandbox-{secrets.token_hex(4)}"
        os.symlink(value, tmp, dir_fd=dir_fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        moved = (
            f"; what the command put there is at {os.path.join(directory, aside)}" if aside else ""
        )
        return f"put back the link {path} -> {value} the command changed{moved}"
    except OSError as exc:
        return f"could not put back the link {path} -> {value}: {exc.strerror}"
    finally:
        os.close(dir_fd)
