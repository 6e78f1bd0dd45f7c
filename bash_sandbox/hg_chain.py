"""What Mercurial's configs include from the writable roots: files host `hg` reads as config.

A repository's `.hg/hgrc` (and `.hg/hgrc-not-shared`) is a protected name, but a config may
pull in another file with `%include <path>` (a team's shared hooks kept in the repository:
`%include ../.hgrc-shared`), and hg runs the hooks and loads the extensions that file names.
A command that writes it runs its code in the host's next `hg status`. So every file an hg
config hg would read for a root's repository includes, or the user's own configs
(`~/.hgrc`, `~/.config/hg/hgrc`, `/etc/mercurial/hgrc` and `hgrc.d/*.rc`), that lies inside
a root is covered read-only as the hook chain is (`git_hook_chain.py`): held by an empty file
while missing (hg skips a missing include silently, so the command could make it), its
parents pinned. Includes are read as hg's own parser reads them (`%include` at the start of
a line, `~` and `$VAR` expanded, relative to the including file), followed to a bounded depth.
"""

from __future__ import annotations

import glob
import os
import re

from bash_sandbox.git_hook_chain import ChainLink
from bash_sandbox.safe_read import read_regular
from policies.autorun import UNPROTECT_KEY
from policies.paths import within_any

# hg's `config.parse`: `%include` then the path to the end of the line, blanks trimmed; hg
# splits lines at `\r` too and drops a UTF-8 byte order mark at the start.
_INCLUDE = re.compile(rb"^%include[ \t\f\v]+(\S|\S.*\S)[ \t\f\v]*$", re.MULTILINE)
_BOM = b"\xef\xbb\xbf"
_MAX_BYTES = 1 << 20
_DEPTH = 8
_FILES = 64


def _user_configs() -> list[str]:
    """The configs hg reads besides a repository's: `HGRCPATH`'s files and directories'
    `*.rc` where it is set (then only those), else the system's and the user's."""
    named = os.environ.get("HGRCPATH")
    if named is not None:
        found: list[str] = []
        for entry in (os.path.expanduser(p) for p in named.split(os.pathsep) if p):
            found += (
                sorted(glob.glob(os.path.join(entry, "*.rc"))) if os.path.isdir(entry) else [entry]
            )
        return found
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    found = [os.path.join(home, ".hgrc"), os.path.join(xdg, "hg", "hgrc")]
    found += ["/etc/mercurial/hgrc", *sorted(glob.glob("/etc/mercurial/hgrc.d/*.rc"))]
    return found


def _hgrcpath_dirs() -> list[str]:
    named = os.environ.get("HGRCPATH") or ""
    entries = (os.path.expanduser(p) for p in named.split(os.pathsep) if p)
    return [os.path.normpath(p) for p in entries if os.path.isdir(p)]


def _repositories(roots: tuple[str, ...]) -> list[str]:
    """The `.hg` of each root's repository: the root's own, or the nearest above it (a
    workspace that is a directory of a repository: its hgrc includes from there too)."""
    found: dict[str, None] = {}
    for root in roots:
        current = root
        while True:
            if os.path.isdir(os.path.join(current, ".hg")):
                found[os.path.join(current, ".hg")] = None
                break
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    return list(found)


def hg_chain(roots: tuple[str, ...], unprotected: tuple[str, ...] = ()) -> list[ChainLink]:
    """The files inside ``roots`` that an hg config of a root's repository, or of the user,
    includes, as chain links (``unprotected``: names relative to a root the policy lifts)."""
    configs = [
        os.path.join(hg, name)
        for hg in _repositories(roots)
        for name in ("hgrc", "hgrc-not-shared")
    ]
    user = _user_configs()
    configs += user
    lifted = {os.path.normpath(os.path.join(r, n)) for r in roots for n in unprotected}
    found: dict[str, ChainLink] = {}
    named = user if os.environ.get("HGRCPATH") is not None else []
    for path in named:
        # One `HGRCPATH` names in a root (a project's file); a home's own hg configs are
        # the home's names (`policies.autorun.HOME_PATHS`).
        if path not in lifted and within_any(os.path.realpath(path), roots):
            why = f"Mercurial reads it as the user's config (HGRCPATH); {UNPROTECT_KEY} lifts it"
            found.setdefault(path, ChainLink(path, False, why))
    for directory in _hgrcpath_dirs():
        # hg reads every `*.rc` in it: a new one counts as much as an existing one.
        if directory not in lifted and within_any(os.path.realpath(directory), roots):
            why = (
                f"Mercurial reads every *.rc in it as the user's config (HGRCPATH); "
                f"{UNPROTECT_KEY} lifts it"
            )
            found.setdefault(directory, ChainLink(directory, True, why))
    queue = [(path, path, 0) for path in configs]
    seen: set[str] = set()
    while queue and len(seen) < _FILES:
        path, origin, depth = queue.pop(0)
        if path in seen or depth > _DEPTH:
            continue
        seen.add(path)
        for target in _includes(path):
            queue.append((target, origin, depth + 1))
            if target in lifted or not within_any(os.path.realpath(target), roots):
                continue
            why = (
                f"Mercurial reads it as config ({origin} includes it) and runs the hooks it "
                f"names; {UNPROTECT_KEY} lifts it"
            )
            found.setdefault(target, ChainLink(target, False, why))
    return list(found.values())


def _includes(path: str) -> list[str]:
    """The files ``path`` includes, as hg resolves them (absolute, normalised)."""
    try:
        data = read_regular(path, _MAX_BYTES)
    except OSError:
        return []
    base = os.path.dirname(path)
    data = data.removeprefix(_BOM).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    out = []
    for match in _INCLUDE.finditer(data):
        # hg's `util.expandpath`: variables first, then `~`.
        named = os.path.expanduser(os.path.expandvars(os.fsdecode(match.group(1))))
        out.append(os.path.normpath(os.path.join(base, named)))
    return out
