"""The placeholders, ignored by the command's own git.

A workspace-write command sees an empty read-only directory for every missing auto-run name
(`placeholders.py`). git shows no empty directory, but `git clean -d` and `git stash -u`
(which cleans) try to remove them, fail on each (a mount point), and exit 1 halfway: the
untracked files already moved into the stash (a user's usability pass). So the command's git
is given an excludes file (`core.excludesFile`, through `GIT_CONFIG_COUNT`, which no config
file overrides) holding the user's own global excludes and each protected name anchored at
the top of every repository the roots lie in (and at each root, for one the command makes):
ignored, they are neither cleaned nor stashed, and `git add -A` never stages a placeholder
file. Nothing of it reaches the host: the file lies in the command's private /tmp, and the
variables live in its environment only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess

from bash_sandbox.host_run import run_bounded
from bash_sandbox.linux.binaries import host_git, host_git_path
from policies import SandboxPolicy
from policies.autorun import SHELL_RC_PATHS

EXCLUDES_NAME = ".bash-sandbox-git-excludes"
# Where the command sees it: its private /tmp is the trust domain's directory on the tmpfs.
EXCLUDES_PATH = f"/tmp/{EXCLUDES_NAME}"
_MAX = 1 << 20
# The value `core.excludesFile` has in the user's global config, by the configs' stamps.
_NAMED: dict[tuple[object, ...], bytes] = {}


def excludes_environment() -> dict[str, str]:
    """The variables that make the command's git read `EXCLUDES_PATH` as its global
    excludes (a request's own `GIT_CONFIG_*` win: they replace these)."""
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.excludesFile",
        "GIT_CONFIG_VALUE_0": EXCLUDES_PATH,
    }


def excludes_text(policy: SandboxPolicy) -> bytes:
    """The user's global excludes, then the protected names (held by placeholders when
    missing) anchored where the command's git would match them."""
    names = [
        n.rstrip("/")
        for n in policy.protected_paths
        if n != ".git" and not n.startswith(".git/") and n not in SHELL_RC_PATHS
    ]
    lines: list[str] = []
    for root in policy.all_writable_roots():
        for top in dict.fromkeys((root, _repository_top(root))):
            if top is None:
                continue
            prefix = os.path.relpath(root, top)
            base = "" if prefix == "." else f"/{prefix}"
            lines += [_escaped(f"{base}/{name}") for name in names]
    block = "\n".join(dict.fromkeys(lines))
    return _user_excludes() + f"\n# bash-sandbox: its placeholders\n{block}\n".encode()


def share_excludes(root_fd: int, domain: str, text: bytes) -> None:
    """``text`` as the trust domain's `EXCLUDES_NAME` on the tmpfs ``root_fd`` (what the
    command sees as `EXCLUDES_PATH`); atomic, and only when missing or changed."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    target = f"{domain}/{EXCLUDES_NAME}"
    with contextlib.suppress(OSError), open(os.open(target, flags, dir_fd=root_fd), "rb") as fh:
        if fh.read(len(text) + 1) == text:
            return
    temp = f"{domain}/.{EXCLUDES_NAME}.{secrets.token_hex(6)}"
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=root_fd)
    try:
        with open(out, "wb") as fh:
            fh.write(text)
        os.rename(temp, target, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=root_fd)
        raise


def _repository_top(root: str) -> str | None:
    """The nearest directory at or above ``root`` holding a `.git` (its worktree's top)."""
    path = root
    while True:
        if os.path.lexists(os.path.join(path, ".git")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _escaped(pattern: str) -> str:
    """``pattern`` taken literally by gitignore (its special characters escaped)."""
    return "".join("\\" + c if c in "*?[]\\!# " else c for c in pattern)


def _user_excludes() -> bytes:
    """The user's own global excludes file, as git would read it (kept while the files
    that name it are unchanged): the variables above replace it for the command."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    configs = (os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config"))
    default = os.path.join(xdg, "git", "ignore")
    key = (home, xdg, *(_stamp(p) for p in configs))
    named = _NAMED.get(key)
    if named is None:
        _NAMED.clear()  # one user's configs at a time
        named = _NAMED[key] = _named_excludes()
    path = named.decode(errors="replace") or default
    path = os.path.expanduser(path)
    try:
        with open(path, "rb") as fh:
            return fh.read(_MAX)
    except OSError:
        return b""


def _named_excludes() -> bytes:
    """`core.excludesFile` as the user's global config says it (empty: not set)."""
    try:
        done = run_bounded(
            [host_git(), "config", "--global", "--get", "core.excludesFile"],
            env={**os.environ, "PATH": host_git_path()},
            cwd="/",
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return b""
    return done.stdout.strip() if done.returncode == 0 else b""


def _stamp(path: str) -> object:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
