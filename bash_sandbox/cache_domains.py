"""The sandbox's own tool cache homes, one per trust domain, and their bounds.

`tool_cache_home(policy)` is `~/.cache/bash-sandbox/caches/<key>` (`trust_domain.py`): the
one cache directory a workspace-write command may write, shared only with commands of the
same domain (the same project under the same policy), so a second `pip install` finds its
cache warm while another project never consumes what this one left there.

Bounded: a domain unused for `CACHE_MAX_AGE_S` (30 days) is removed, and beyond
`CACHE_MAX_DOMAINS` (32) the least recently used go first; never one that a live process
holds (a shared flock on `.locks/<key>`, taken before the directory is made and held for the
process's lifetime; a sweeper removes only what it can lock exclusively). `.locks/<key>.json`
says which policy a domain is, and its mtime is the LRU stamp. The old shared home
(`~/.cache/bash-sandbox/tools`, one for every project) is removed on first use: it may hold
code planted by any project.

Where: the real folder `$XDG_CACHE_HOME` (or `~/.cache`) led to when this uid first used it,
recorded in the per-uid directory no confined command sees (`user_base_dir()/cache-folders`)
and never resolved again. `~/.cache` may be a link, and a link in a writable root (a home
that is a workspace) is a command's to replace: following it anew each time let one
project move every later project's cache into its own workspace, pre-filled.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import threading
import time
import uuid

from bash_local.userdir import user_base_dir
from bash_sandbox.state import remove_tree
from bash_sandbox.trust_domain import domain_fields, domain_key
from policies import SandboxPolicy
from policies.paths import within, within_any

CACHE_MAX_DOMAINS = 32
CACHE_MAX_AGE_S = 30 * 24 * 3600
# A stamp is refreshed at most this often (one utime per spawn would be wasted work).
_STAMP_EVERY_S = 60
_LOCKS = ".locks"
# A shared lock is tried this often, this far apart (a sweep holds one domain's briefly).
_SHARE_TRIES, _SHARE_WAIT_S = 20, 0.005
# In the per-uid directory: the real cache folder each named one led to at first use.
_RECORDS = "cache-folders"
# A refused write there (a root holding them): another project's caches.
REASON_CACHE_HOMES = "the sandbox's tool cache homes: every project's package caches"
_TRASH = ".trash-"

# When each domain was stamped, and which cache bases this process swept.
_stamped: dict[str, float] = {}
_swept: set[str] = set()
_mutex = threading.Lock()


def _owned_dir(path: str) -> bool:
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (
        os.path.isdir(path)
        and not os.path.islink(path)
        and st.st_uid == os.geteuid()
        and os.access(path, os.W_OK | os.X_OK)
    )


def named_cache_folder() -> str:
    """The user's cache folder as the environment names it (`$XDG_CACHE_HOME`, `~/.cache`)."""
    named = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.normpath(named)


def _record_of(named: str) -> str:
    digest = hashlib.sha256(os.fsencode(named)).hexdigest()[:32]
    return os.path.join(user_base_dir(), _RECORDS, digest)


def cache_folder() -> str | None:
    """The real folder ``named_cache_folder()`` led to when this uid first used it (recorded
    then, read since: a link replaced later moves nothing), or None when it cannot be
    recorded or is no longer a folder of ours that nobody else may write (`_trusted`)."""
    named = named_cache_folder()
    try:
        record = _record_of(named)
        recorded = _read_record(record)
        if recorded is None:
            _write_record(record, os.path.realpath(named))
            recorded = _read_record(record)
    except OSError:
        return None
    return recorded if recorded is not None and _trusted(recorded) else None


def _read_record(record: str) -> str | None:
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        text = os.fsdecode(fh.read(8192))  # the path's own bytes, as written
    return text if text.startswith("/") and "\n" not in text else None


def _write_record(record: str, folder: str) -> None:
    """Write ``record`` unless another process did first (a link never replaces a file)."""
    parent = os.path.dirname(record)
    with contextlib.suppress(FileExistsError):
        os.mkdir(parent, 0o700)
    tmp = f"{record}.{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.fsencode(folder))
    finally:
        os.close(fd)
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, record)
    finally:
        os.unlink(tmp)


def _trusted(folder: str) -> bool:
    """``folder`` is still reached without a link, and is a directory of this uid that others
    may not write. Its group may (umask 002 is common): a name swapped in by someone else is
    theirs, and `_real_base` takes only directories of ours."""
    with contextlib.suppress(OSError):
        os.makedirs(folder, 0o700, exist_ok=True)
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return (
        os.path.realpath(folder) == folder
        and stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & 0o002
    )


def cache_moved() -> str | None:
    """Where the user's cache folder leads now, when that is not the recorded folder."""
    now = os.path.realpath(named_cache_folder())
    recorded = cache_folder()
    return now if recorded is not None and now != recorded else None


def cache_base() -> str | None:
    """Where the per-domain cache homes of this user live (None: nowhere we trust). Below
    the recorded folder, `bash-sandbox/caches` must be real directories (`_real_base`),
    never links a command left there to lead the sweep elsewhere."""
    folder = cache_folder()
    return os.path.join(folder, "bash-sandbox", "caches") if folder is not None else None


def cache_top() -> str | None:
    """The sandbox's directory in the user's cache (`~/.cache/bash-sandbox`)."""
    base = cache_base()
    return os.path.dirname(base) if base is not None else None


def exposed_to(policy: SandboxPolicy) -> bool:
    """Whether a writable root of ``policy`` holds the cache homes (a workspace that is
    the user's home, a root `~/.cache`) or lies inside them: its commands could plant
    code in every other domain's cache and links for the sweep, so that policy gets no
    cache home there, and its view covers the directory read-only (`host_view.py`)."""
    top = cache_top()
    return top is not None and exposes(top, policy)  # None: no cache homes at all


def exposes(top: str, policy: SandboxPolicy) -> bool:
    """`exposed_to` for a ``top`` the caller already looked up (each look is a read of the
    record and a few stats)."""
    roots = policy.all_writable_roots()
    return within_any(top, roots) or any(within(r, top) for r in roots)


def ensure_cache_base() -> bool:
    """Make the cache base (real directories of ours); False when a link or a stranger's
    directory is in the way."""
    base = cache_base()
    with _mutex:
        return base is not None and _real_base(base)


def _real_base(base: str) -> bool:
    """``base`` and its parent are directories of ours, not links (created if missing)."""
    return _owned_dir(os.path.dirname(base)) and _owned_dir(base)


class CacheHolds:
    """The cache domains one executor uses, each held by a shared flock until `close()` (a
    sweeper elsewhere removes only what it can lock exclusively)."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def tool_cache_home(policy: SandboxPolicy, holds: CacheHolds, reach: str = "") -> str | None:
    """The sandbox's own cache home for ``policy``'s trust domain (created 0700, held in
    ``holds``), or None when the home cannot hold one (read-only, not ours): caches then
    stay in the call's private /tmp. ``reach``: what the executor's own settings add
    (`trust_domain.executor_reach`): the homes are shared by every executor of the user."""
    base = cache_base()
    key = domain_key(policy, reach)
    if base is None or exposed_to(policy):
        return None
    with _mutex:
        if not _real_base(base) or not _owned_dir(os.path.join(base, _LOCKS)):
            return None
        if base not in _swept:
            _swept.add(base)
            sweep_caches(base)
        path = os.path.join(base, key)
        try:
            if path not in holds.fds:
                # Held before the directory is made: a sweeper never removes it under us.
                fd = os.open(
                    os.path.join(base, _LOCKS, key),
                    os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                )
                if not _share(fd):
                    os.close(fd)
                    return None  # held exclusively past a sweep's moment: /tmp caches
                holds.fds[path] = fd
            if not _owned_dir(path):
                return None
            _stamp(base, key, domain_fields(policy, reach))
        except OSError:
            return None
        return path


def _share(fd: int) -> bool:
    """A shared flock on ``fd``, never waited for past a sweep's removal of one domain:
    this runs on the executor's event loop, and an exclusive lock held for longer is no
    sweeper's (commands never see `.locks`: `locks_dir`, hidden)."""
    for _ in range(_SHARE_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(_SHARE_WAIT_S)
    return False


def locks_dir() -> str | None:
    """The domains' lock files: hidden from every command (a lock a command could take
    would hold off the next executor's spawn in another project)."""
    base = cache_base()
    return os.path.join(base, _LOCKS) if base is not None else None


def _stamp(base: str, key: str, fields: dict[str, object]) -> None:
    """Record that ``key`` was used now (its description file's mtime: the LRU order)."""
    described = os.path.join(base, _LOCKS, key + ".json")
    now = time.time()
    if now - _stamped.get(described, 0.0) < _STAMP_EVERY_S:
        return
    if not os.path.exists(described):
        # Which policy this domain is, for a human looking at ~/.cache/bash-sandbox/caches.
        tmp = f"{described}.{uuid.uuid4().hex}"
        with open(tmp, "w") as fh:
            json.dump(fields, fh, indent=1)
        os.replace(tmp, described)
    os.utime(described)
    _stamped[described] = now


def sweep_caches(
    base: str, *, max_domains: int = CACHE_MAX_DOMAINS, max_age_s: float = CACHE_MAX_AGE_S
) -> list[str]:
    """Remove the domains unused for ``max_age_s``, then the least recently used beyond
    ``max_domains``, skipping any a live process holds; returns the keys removed. Also the
    old shared home and the trash of an interrupted sweep."""
    if not _real_base(base):
        return []  # a link where the base should be: never swept through
    parent = os.path.dirname(base)
    legacy = os.path.join(parent, "tools")
    if os.path.isdir(legacy) and not os.path.islink(legacy):
        _discard(legacy, base)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        if name.startswith(_TRASH):  # a deletion the process's exit cut short
            # (remove_tree removes a link as a link: never what it points at)
            threading.Thread(
                target=remove_tree, args=(os.path.join(base, name),), daemon=True
            ).start()
    used: list[tuple[float, str]] = []
    for name in names:
        if name.startswith(".") or not _is_real_dir(os.path.join(base, name)):
            continue
        try:
            mtime = os.stat(os.path.join(base, _LOCKS, name + ".json")).st_mtime
        except OSError:
            mtime = 0.0
        used.append((mtime, name))
    used.sort(reverse=True)  # most recent first
    now = time.time()
    victims = [k for i, (m, k) in enumerate(used) if i >= max_domains or now - m > max_age_s]
    removed = []
    for key in victims:
        # One this process holds fails the exclusive lock below too (another description).
        lock = os.path.join(base, _LOCKS, key)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live executor uses it
        try:
            _discard(os.path.join(base, key), base)
            with contextlib.suppress(OSError):
                os.unlink(lock + ".json")
            removed.append(key)
        finally:
            os.close(fd)
    return removed


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _discard(path: str, base: str) -> None:
    """Move ``path`` out of reach at once (a rename), then delete it in the background:
    a big cache takes seconds to delete, a spawn should not wait for it."""
    trash = os.path.join(base, f"{_TRASH}{uuid.uuid4().hex}")
    try:
        os.rename(path, trash)
    except OSError:
        return
    threading.Thread(target=remove_tree, args=(trash,), daemon=True).start()
