"""The per-user directory every executor of this uid shares, and the spill dirs it knows of.

`user_base_dir()` is `<tempdir>/bash-sandbox-<uid>` (0700, owned by this uid; a planted path,
a symlink, a directory open to others, or one inside a writable root some executor of this
uid granted is never used: the next candidate is). Every
executor spills under `<base>/spill/` unless its config names another parent. Every spill
parent that is not in a fixed base (a custom one, or the default one of a base under another
`TMPDIR`) is recorded in this uid's fixed bases (`spill-parents`), so a confining executor
hides every spill this uid's executors write, whichever executor wrote it, whatever its
`TMPDIR`, and after the base that recorded it is gone (a /tmp cleaner, a reboot: /var/tmp's
record stays). The fixed bases themselves are hidden from every command.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import stat
import tempfile
from collections.abc import Iterable

from policies.paths import within_any

# Where a base recorded its custom spill parents before they were recorded uid-wide: read
# for this base, and merged into the fixed bases' record once (`_merge_legacy_registries`).
_REGISTRY = "spill-dirs"


def _usable(path: str) -> bool:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


@functools.cache
def _base_for(uid: int, tempdir: str) -> str:
    name = f"bash-sandbox-{uid}"
    roots: tuple[str, ...] = ()
    with contextlib.suppress(OSError):
        # Pruned of the gone ones here, once a process (a stat of each): read as they are.
        roots = _recorded_live(_ROOTS)
        _merge_legacy_registries(_recorded_live(_BASES))
        _recorded_live(_SPILLS)
    for parent in dict.fromkeys((tempdir, "/tmp", "/var/tmp")):
        candidate = os.path.join(parent, name)
        # Inside a root some executor granted, a command may have made it, state and all
        # (the fixed ones never are: every executor refuses a root holding them).
        fixed = parent in _FIXED_PARENTS
        if (fixed or not within_any(os.path.realpath(candidate), roots)) and _usable(candidate):
            base = os.path.realpath(candidate)
            with contextlib.suppress(OSError):
                record(_BASES, base)
            return base
    raise OSError(f"no safe per-user directory for bash-sandbox (tried {tempdir}, /tmp, /var/tmp)")


def user_base_dir() -> str:
    """This uid's shared directory (created on first use)."""
    return _base_for(os.geteuid(), tempfile.gettempdir())


def default_spill_parent() -> str:
    """`<base>/spill`, recorded uid-wide before the first spill file is made there when the
    base is not a fixed one (another `TMPDIR`): the fixed bases are hidden as they are."""
    base = user_base_dir()
    path = os.path.join(base, "spill")
    if not _usable(path):
        raise OSError(f"unsafe spill directory {path}")
    if base not in fixed_bases():
        register_spill_parent(path)
    return path


def register_spill_parent(path: str) -> None:
    """Record a spill parent in every fixed base so every sandbox of this uid hides it,
    whatever its `TMPDIR` (and drop those gone: each executor's start prunes the record).
    Raises OSError when no fixed base took it: spilling there would be readable."""
    real = os.path.realpath(path)
    taken = False
    for base in fixed_bases():
        registry = os.path.join(base, _SPILLS)
        with contextlib.suppress(OSError):  # a full disk in one: the other may take it
            _append(registry, real)
            taken = True
            _pruned(registry, _read_kept(registry))
    if not taken:
        raise OSError(f"spill parent {real} could not be recorded in {fixed_bases()}")


def recorded_spill_parents() -> tuple[str, ...]:
    """Every spill parent recorded, gone or not, read again only when a record changed:
    what each spawn hides (a gone one costs nothing there; the spawn's own look at each
    hidden path is the only stat, not one here as well). This base's own registry from
    before the uid-wide record is read as well (an older executor may still write it)."""
    records = [os.path.join(base, _SPILLS) for base in fixed_bases()]
    records.append(os.path.join(user_base_dir(), _REGISTRY))
    read = tuple(_read_kept(r) for r in records)
    last = _spill_union.get(None)
    if last is None or last[0] != read:  # the same kept tuples: compared by identity first
        last = _spill_union[None] = (read, tuple(p for p in _union(read) if p[:1] == "/"))
    return last[1]


# The last records read and their union (asked before every spawn; they rarely change).
_spill_union: dict[None, tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]] = {}


def registered_spill_parents() -> tuple[str, ...]:
    """Every spill parent recorded that still exists. Those gone are dropped from the
    records (read before every confined spawn: they must not grow with every parent ever
    used)."""
    return _recorded_live(_SPILLS)


def _merge_legacy_registries(bases: tuple[str, ...]) -> None:
    """Once per fixed base (its `spill-parents` missing): record in it what executors from
    before the uid-wide record spilled into: the custom parents each live base recorded in
    its own registry, and the default parent of each base that is not a fixed one."""
    for fixed in fixed_bases():
        registry = os.path.join(fixed, _SPILLS)
        if os.path.lexists(registry):
            continue
        legacy = _union(_read_names(os.path.join(b, _REGISTRY)) for b in (*bases, fixed))
        own = (os.path.join(b, "spill") for b in bases if b not in fixed_bases())
        legacy += tuple(p for p in own if os.path.isdir(p))
        for parent in legacy:
            if parent[:1] == "/":
                _append(registry, parent)
        # Made even when there was nothing to copy: merged, never again.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(registry, flags, 0o600))


def _append(registry: str, real: str) -> None:
    """Add the path ``real`` to ``registry`` (NUL-ended records, under its lock) unless it
    is there already."""
    record = os.fsencode(real)
    fd = os.open(registry, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # every writer takes it: the end is ours to write at
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        if data and b"\0" not in data and data.endswith(b"\n"):
            # Written one path a line before: rewritten with NULs first, so the two never mix.
            data = b"".join(line + b"\0" for line in data.split(b"\n") if line)
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        elif not data.endswith(b"\0"):
            # A record cut short (a kill or a full disk within its write): dropped, or the
            # next one would be joined to it and neither named.
            data = data[: data.rfind(b"\0") + 1]
            os.ftruncate(fd, len(data))
        if record not in data.split(b"\0"):
            os.pwrite(fd, record + b"\0", len(data))
    finally:
        os.close(fd)


def _read_live(registry: str) -> tuple[str, ...]:
    """The paths in ``registry`` that still exist; the registry pruned of the others."""
    return _pruned(registry, _read_names(registry))


def _pruned(registry: str, named: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``named`` (read from ``registry``) that exist; ``registry`` pruned of the
    others when there are any."""
    live = _live(named)
    if len(live) < len(named):
        with contextlib.suppress(OSError):
            _prune(registry)
    return live


# -- where every base is known ----------------------------------------------------------
#
# A base may lie under any `TMPDIR`, and a harness whose `TMPDIR` is inside another's
# workspace has its base (state, journals, the warm daemon's socket) where that one's
# commands can write. So the bases and the writable roots every executor of this uid used
# are recorded in the fixed bases (`/tmp`, `/var/tmp`), which every confined command has
# hidden: a base is never taken inside a recorded root, and each recorded base inside a
# call's writable roots is hidden from its commands (`state.hidden_paths`).
_FIXED_PARENTS = ("/tmp", "/var/tmp")
_ROOTS, _BASES, _SPILLS = "roots", "bases", "spill-parents"
_recorded: set[tuple[str, str]] = set()


def fixed_bases() -> tuple[str, ...]:
    """This uid's directories in `/tmp` and `/var/tmp` (made when missing), resolved."""
    return _fixed_bases(os.geteuid())


@functools.cache
def _fixed_bases(uid: int) -> tuple[str, ...]:
    found = (os.path.join(p, f"bash-sandbox-{uid}") for p in _FIXED_PARENTS)
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found if _usable(p)))


def record(kind: str, path: str) -> None:
    """Record ``path`` (a writable root, `roots`, or a base, `bases`) in every fixed base;
    once per process and path."""
    real = os.path.realpath(path)
    if (kind, real) in _recorded:
        return
    done = True
    for base in fixed_bases():
        try:
            _append(os.path.join(base, kind), real)
        except OSError:
            done = False  # a full disk, say: asked again at the next spawn
    if done:
        _recorded.add((kind, real))


def _read_names(registry: str) -> tuple[str, ...]:
    try:
        fd = os.open(registry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a prune rewrites it in place under LOCK_EX
        return _named(fd)
    except OSError:
        return ()
    finally:
        os.close(fd)


def recorded(kind: str) -> tuple[str, ...]:
    """Every path of ``kind`` recorded in a fixed base (some may be gone: each process
    prunes them when it picks its base)."""
    return _union(_read_kept(os.path.join(base, kind)) for base in fixed_bases())


def _recorded_live(kind: str) -> tuple[str, ...]:
    """`recorded`, only those that exist, the registries pruned of the others."""
    return _union(_read_live(os.path.join(base, kind)) for base in fixed_bases())


def _union(lists: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for paths in lists:
        found.update(dict.fromkeys(paths))
    return tuple(found)


_kept: dict[str, tuple[tuple[int, int, int], tuple[str, ...]]] = {}


def _read_kept(registry: str) -> tuple[str, ...]:
    """The paths in ``registry``, read again only when the file changed (its inode, size or
    mtime): a registry is asked at every spawn and a machine's can hold hundreds of paths.
    Whether each still exists is the caller's to ask."""
    try:
        st = os.stat(registry)
    except OSError:
        return ()
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    kept = _kept.get(registry)
    if kept is None or kept[0] != stamp:
        kept = _kept[registry] = (stamp, _read_names(registry))
    return kept[1]


def record_roots(roots: tuple[str, ...]) -> None:
    for root in roots:
        record(_ROOTS, root)


def recorded_bases() -> tuple[str, ...]:
    return recorded(_BASES)


def _live(named: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in named if p.startswith("/") and os.path.isdir(p))


def _named(fd: int) -> tuple[str, ...]:
    """The registry's paths: each ended by a NUL, as the bytes the filesystem has (a path
    may hold a newline, or bytes that are not UTF-8, and must still be hidden); a registry
    written before that holds one path a line."""
    with os.fdopen(os.dup(fd), "rb") as fh:
        data = fh.read(1 << 20)
    if b"\0" in data or not data.endswith(b"\n"):
        # Only whole records: one cut short by a kill or a full disk names some other path.
        records = data.split(b"\0")[:-1]
    else:
        records = data.split(b"\n")
    return tuple(dict.fromkeys(os.fsdecode(r) for r in records if r))


def _prune(registry: str) -> None:
    """Keep only the parents that still exist. In place, under the lock registrations take
    to append: a rename would lose an append made to the old file meanwhile. Nothing of
    ours is left in a parent that is gone (its spill dir went with it); a directory made
    there later is no spill parent until an executor registers it again."""
    fd = os.open(registry, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        named = _named(fd)
        live = _live(named)
        if len(live) == len(named):
            return
        data = b"".join(os.fsencode(p) + b"\0" for p in live)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
