"""Symbolic links in a writable root that a host name leads through, put back after a command.

A home name can reach a root through a link that lies *in* the root (a dotfiles tree:
`~/.ssh -> dotfiles/ssh`, `dotfiles/ssh -> ssh-real`, the workspace `~/dotfiles`). No mount
can hold a link (a mount point is never a link), so a command can re-point it in one rename,
and host ssh then reads the command's directory as `~/.ssh` (a red team's). The run says so
(`partial`), the real directories between the root and the link are pinned (a command
swapped one for a link out of the roots, and the put-back wrote there: a red team's), the
cover watch stops the command when the link changes, and after the command each such link is
put back as the spawn found it, reached from its root one directory at a time, never through
a link: whatever the command left there is moved aside beside it (never deleted: it may hold
the user's work).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from bash_sandbox.safe_read import open_below
from policies.paths import within


def snapshot_links(paths: list[str], roots: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """(root, path, target) of each of ``paths`` that is a symbolic link in a root now."""
    found: list[tuple[str, str, str]] = []
    for path in paths:
        root = next((r for r in roots if within(path, r) and path != r), None)
        if root is None:
            continue
        with contextlib.suppress(OSError):
            found.append((root, path, os.readlink(path)))
    return tuple(found)


def put_back(root: str, path: str, value: str) -> str | None:
    """Make ``path`` (in ``root``) the link to ``value`` it was, if the command changed it;
    a warning naming what was done, or None (unchanged). Never through a link: a directory
    on the way that is no longer a directory is named, and nothing is done."""
    directory, name = os.path.split(path)
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            rel = os.path.relpath(directory, root)
            dir_fd = open_below(top, "" if rel == "." else rel)
        finally:
            os.close(top)
    except OSError as exc:
        return f"could not put back the link {path} (a directory on its way: {exc.strerror})"
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
        moved = ""
        if aside:
            moved = f"; what the command put there is at {os.path.join(directory, aside)}"
        return f"put back the link {path} -> {value} the command changed{moved}"
    except OSError as exc:
        return f"could not put back the link {path} -> {value}: {exc.strerror}"
    finally:
        os.close(dir_fd)
