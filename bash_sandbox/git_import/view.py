"""The command's git directory, read as an untrusted remote: scanned within bounds, then
laid out as a private "import view" only the executor's own git reads.

The overlay's upper layer holds every file the command wrote (and a whiteout for each it
removed). Nothing there is trusted: not its names, not its contents, not its sizes. The scan
walks it without following links, refuses what is not a regular file, a file whose blocks
do not back its size (sparse) and anything over the git-state cap, and reads nothing. The
view is a bare repository the executor writes itself (config, no hooks): the upper's object
files linked in, the host's object store as its alternate, the host's refs overlaid with the
command's exactly as the overlay showed them. Git's own parser reads it from there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from dataclasses import dataclass, field

# A generous default for all the git state one command may hand back (objects included).
GIT_STATE_CAP_BYTES = 1 << 30
MAX_ENTRIES = 200_000
# A file this large whose blocks back less than half of it is sparse: refused (a pack of
# zeros would otherwise cost its full size on the host).
_SPARSE_MIN = 1 << 20

_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")


class ScanRefused(Exception):
    """The upper layer cannot be imported at all (over the cap, too many entries)."""


@dataclass
class UpperScan:
    """Regular files, whiteouts and opaque directories of one upper layer (relative paths)."""

    files: dict[str, os.stat_result] = field(default_factory=dict)
    whiteouts: set[str] = field(default_factory=set)
    opaque: set[str] = field(default_factory=set)
    odd: list[str] = field(default_factory=list)  # links, fifos, devices: never imported
    refused: list[str] = field(default_factory=list)  # sparse or oversized, with why
    total: int = 0

    def empty(self) -> bool:
        return not (self.files or self.whiteouts or self.opaque or self.odd or self.refused)

    def removed(self, rel: str) -> bool:
        """Whether the command removed ``rel`` (a whiteout on it or on a parent, or an
        opaque parent hiding the host's copy)."""
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix in self.whiteouts:
                return True
            if i < len(parts) and prefix in self.opaque:
                return True
        return False


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    for name in _OPAQUE:
        with contextlib.suppress(OSError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False


def scan_upper(
    upper: str, *, skip: frozenset[str] = frozenset(), cap: int = GIT_STATE_CAP_BYTES
) -> UpperScan:
    """Walk ``upper`` (never following a link), bounded by ``cap`` bytes and MAX_ENTRIES."""
    scan = UpperScan()
    stack = [""]
    entries = 0
    while stack:
        rel_dir = stack.pop()
        path = os.path.join(upper, rel_dir) if rel_dir else upper
        try:
            listing = list(os.scandir(path))
        except OSError:
            continue
        for entry in listing:
            entries += 1
            if entries > MAX_ENTRIES:
                raise ScanRefused(f"more than {MAX_ENTRIES} files in the git directory's changes")
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel in skip:
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if _opaque(entry.path):
                    scan.opaque.add(rel)
                stack.append(rel)
            elif _is_whiteout(st):
                scan.whiteouts.add(rel)
            elif not stat.S_ISREG(st.st_mode):
                scan.odd.append(rel)
            elif st.st_size >= _SPARSE_MIN and st.st_blocks * 512 * 2 < st.st_size:
                scan.refused.append(f"{rel}: a sparse file ({st.st_size} bytes)")
            else:
                scan.total += st.st_size
                if scan.total > cap:
                    raise ScanRefused(f"the command's git state exceeds the {cap}-byte cap")
                scan.files[rel] = st
    return scan


def _alternate_line(path: str) -> bytes:
    """``path`` as a line of `objects/info/alternates`: as it is, or C-quoted as git reads
    a line that starts with `"` (git 2.11+) where it holds a newline (a workspace path may:
    unquoted, git read two paths and the import's fetch failed)."""
    raw = os.fsencode(path)
    if b"\n" not in raw:
        return raw + b"\n"
    quoted = b"".join(
        b"\\" + bytes([c]) if c in b'"\\' else bytes([c]) if 0x20 <= c < 0x7F else b"\\%03o" % c
        for c in raw
    )
    return b'"' + quoted + b'"\n'


def _link_or_copy(src: str, dst: str, made: set[str] | None = None) -> None:
    parent = os.path.dirname(dst)
    if made is None or parent not in made:
        os.makedirs(parent, exist_ok=True)
        if made is not None:
            made.add(parent)
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copyfile(src, dst, follow_symlinks=False)  # streamed (sendfile), never whole


# A host file up to this size is copied into the view, not linked: a link changes the host
# file's ctime, and every answer kept about the host's refs and HEAD (`kept_answers.py`)
# stamps it, so each import made the next spawns ask host git again (two processes).
_COPY_MAX = 1 << 16


def _from_host(src: str, dst: str) -> None:
    """A file of the host's git dir into the view, leaving the host's file as it was."""
    if os.lstat(src).st_size > _COPY_MAX:
        _link_or_copy(src, dst)  # a large packed-refs: a copy would cost more than git
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst, follow_symlinks=False)


def _host_files(gitdir: str, rel_dir: str, limit: int = MAX_ENTRIES) -> list[str]:
    """Regular files below ``gitdir/rel_dir`` (relative to ``gitdir``), links not followed."""
    found: list[str] = []
    stack = [rel_dir]
    while stack and len(found) < limit:
        current = stack.pop()
        try:
            listing = list(os.scandir(os.path.join(gitdir, current)))
        except OSError:
            continue
        for entry in listing:
            rel = f"{current}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                stack.append(rel)
            elif entry.is_file(follow_symlinks=False):
                found.append(rel)
    return found


_OBJECT_FILES = (".pack", ".idx")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _object_kind(rel: str) -> str | None:
    """`loose` or `pack` for a file git reads as objects; None for anything else."""
    parts = rel.split("/")
    if len(parts) != 3:
        return None
    if len(parts[1]) == 2 and _HEX.fullmatch(parts[1] + parts[2]):
        return "loose"
    if parts[1] == "pack" and parts[2].startswith("pack-") and parts[2].endswith(_OBJECT_FILES):
        return "pack"
    return None


def _bare(path: str, object_format: str) -> None:
    """An empty bare repository of the executor's own config at ``path``: never the
    command's, never the host's (no promisor remote, no hooks, nothing it runs)."""
    os.makedirs(os.path.join(path, "objects", "info"))
    os.makedirs(os.path.join(path, "refs"))
    with open(os.path.join(path, "config"), "w") as fh:
        if object_format == "sha1":
            fh.write("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
        else:
            fh.write(
                "[core]\n\trepositoryformatversion = 1\n\tbare = true\n"
                f"[extensions]\n\tobjectformat = {object_format}\n"
            )


def _default_head(path: str) -> None:
    if not os.path.exists(os.path.join(path, "HEAD")):
        with open(os.path.join(path, "HEAD"), "w") as fh:
            fh.write("ref: refs/heads/main\n")


def host_objects(path: str, host_gitdir: str, *, object_format: str) -> str:
    """A bare repository at ``path`` whose only objects are the host's (an alternate):
    asked for an object the host lacks, git answers `missing`, where in the host's own
    repository a partial clone's promisor remote makes it fetch or, with lazy fetching
    off, fail (every import of a `--filter=blob:none` clone failed: a red team's)."""
    if not os.path.isdir(path):
        _bare(path, object_format)
        with open(os.path.join(path, "objects", "info", "alternates"), "wb") as fh:
            fh.write(_alternate_line(os.path.realpath(os.path.join(host_gitdir, "objects"))))
        _default_head(path)
    return path


def build_view(
    view: str, host_gitdir: str, upper: str, scan: UpperScan, *, object_format: str
) -> list[str]:
    """Lay out the import view at ``view``; returns the object files of the upper layer that
    were left out (an alternates file, anything git does not read as objects)."""
    _bare(view, object_format)
    kinds = {rel: _object_kind(rel) for rel in scan.files if rel.startswith("objects/")}
    left_out = [rel for rel, kind in kinds.items() if kind is None and rel != "objects/info/packs"]
    alternates = [os.path.realpath(os.path.join(host_gitdir, "objects"))]
    if left_out or any(rel.startswith("objects/") for rel in scan.odd):
        # Something besides object files (a link, an alternates file, a commit-graph): only
        # the object files are linked into the view, one by one.
        made: set[str] = set()
        for rel, kind in kinds.items():
            if kind is not None:
                _link_or_copy(os.path.join(upper, rel), os.path.join(view, rel), made)
    elif kinds:
        # Only loose objects and packs (and whiteouts, which git reads as missing): git
        # reads the upper layer's object directory as a second alternate, nothing copied.
        alternates.append(os.path.join(upper, "objects"))
    with open(os.path.join(view, "objects", "info", "alternates"), "wb") as fh:
        fh.write(b"".join(_alternate_line(path) for path in alternates))
    # Refs as the overlay showed them: the host's loose refs and packed-refs, under the
    # command's (its whiteouts remove, its opaque directories hide the host's).
    for rel in _host_files(host_gitdir, "refs"):
        if rel not in scan.files and not scan.removed(rel):
            _from_host(os.path.join(host_gitdir, rel), os.path.join(view, rel))
    for rel in scan.files:
        if rel.startswith("refs/"):
            _link_or_copy(os.path.join(upper, rel), os.path.join(view, rel))
    for name in ("packed-refs", "HEAD"):
        if name in scan.files:
            _link_or_copy(os.path.join(upper, name), os.path.join(view, name))
        elif name not in scan.whiteouts and os.path.isfile(os.path.join(host_gitdir, name)):
            _from_host(os.path.join(host_gitdir, name), os.path.join(view, name))
    _default_head(view)
    return left_out


def add_admin_head(view: str, admin: str, head_file: str) -> str:
    """A linked worktree's admin dir in the view (git's own layout), so git reads its HEAD;
    returns its path."""
    path = os.path.join(view, admin)
    os.makedirs(path, exist_ok=True)
    _link_or_copy(head_file, os.path.join(path, "HEAD"))
    with open(os.path.join(path, "commondir"), "w") as fh:
        fh.write("../..\n")
    with open(os.path.join(path, "gitdir"), "w") as fh:
        fh.write("/nonexistent/.git\n")
    return path
