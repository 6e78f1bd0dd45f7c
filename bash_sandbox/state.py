"""The executor's private state: where it lives, and the check that it stays out of reach.

Every confined spawn uses paths here (the mount points of the private `/tmp`, `/dev/shm` and
ptys, the placeholder sources, the git overlays' upper directories), so a command that could
write here could redirect the next spawn. The rule, by construction:

1. the state directory is made 0700 under this uid's base (`bash_local.userdir`), or, when
   that base lies inside a configured writable root, under the first candidate that does
   not (`/var/tmp`, `/tmp`, `~/.cache`);
2. it is held by a descriptor from creation on, and before each spawn `check()` verifies
   that the path still names that very directory (device, inode, owner, mode) and that no
   writable root of *this call's* policy contains it (a per-call policy can add roots);
3. every confined command has the whole per-user base hidden (`hidden_paths`), the fixed
   bases, and every spill parent recorded uid-wide (`userdir.register_spill_parent`), so no
   command reads another executor's state or any spill file of this uid, whatever `TMPDIR`
   the executor that spilled had, and after its base is gone.

The private `/tmp` and `/dev/shm` are one tmpfs each per executor, but a command sees only
its trust domain's directory in them (`scratch_for`, `trust_domain.py`): a call wider in any
dimension than the calls that wrote there gets a fresh one, an equal call finds its files.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bash_local.userdir import (
    fixed_bases,
    record_roots,
    recorded_bases,
    recorded_spill_parents,
    user_base_dir,
)
from bash_sandbox.backends.mount_plan import PlaceholderSources, make_placeholder_sources
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.linux.dir_watch import FILESYSTEM_MAGIC, LOCAL_FILESYSTEMS, filesystem_type
from bash_sandbox.linux.namespaces import NamespaceFds, ScratchPaths
from bash_sandbox.trust_domain import domain_key
from bash_seam import InvalidRequestError
from policies import SandboxPolicy
from policies.paths import within, within_any

logger = logging.getLogger(__name__)


def _safe_dir(path: str) -> bool:
    with contextlib.suppress(OSError):  # another's, or not ours to make: lstat says which
        os.makedirs(path, 0o700, exist_ok=True)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


# Filesystems a git overlay's upper layer (kept in the executor's state) can live on: the
# local ones but overlayfs itself (a container's root filesystem, where /tmp and ~/.cache
# usually are: the overlay's mount fails with EINVAL, and every workspace-write spawn in a
# repository with it) and ramfs (no extended attributes).
UPPER_FILESYSTEMS = LOCAL_FILESYSTEMS - {FILESYSTEM_MAGIC["overlayfs"], FILESYSTEM_MAGIC["ramfs"]}


def state_parent(roots: tuple[str, ...]) -> str:
    """A 0700 directory of this uid for executor state, outside every root in ``roots``:
    the first candidate on a filesystem that can hold an overlay's upper layer; where none
    is (a container whose disk is overlayfs), this uid's directory in /dev/shm (a tmpfs);
    else the first usable one (then only a repository's overlay fails, as it must)."""
    uid = os.geteuid()
    candidates = [
        os.path.join(user_base_dir(), "state"),
        f"/var/tmp/bash-sandbox-{uid}/state",
        f"/tmp/bash-sandbox-{uid}/state",
        os.path.join(os.path.expanduser("~"), ".cache", "bash-sandbox", "state"),
    ]
    usable: list[str] = []
    for candidate in [*candidates, f"/dev/shm/bash-sandbox-{uid}/state"]:
        real = os.path.realpath(candidate)
        if any(within(real, r) or within(r, real) for r in roots):
            continue
        if not _safe_dir(os.path.dirname(real)) or not _safe_dir(real):
            continue
        if filesystem_type(real) in UPPER_FILESYSTEMS:
            return real
        usable.append(real)
    if usable:
        return usable[0]
    raise SandboxUnavailableError(
        "read-only",
        "no place for the executor's state outside the writable roots "
        f"(tried {', '.join(candidates)})",
    )


def remove_tree(path: str) -> None:
    """Delete a state tree, including mode-000 placeholders and overlay work dirs.

    Its contents may be a command's (a git overlay's upper layer, a tool cache): a link,
    at the top or anywhere below, is removed as a link and never followed, so nothing
    outside the tree is ever chmodded or deleted. (`os.chmod(..., follow_symlinks=False)`
    raises NotImplementedError on Linux for a link: one planted link used to abort every
    later cleanup and sweep.)"""
    try:
        top = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(top.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            child = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(child).st_mode):
                    os.chmod(child, 0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _make_scratch(key: str, root_fd: int) -> None:
    """``key`` in the tmpfs held by ``root_fd``: sticky and open to all like a /tmp."""
    try:
        os.mkdir(key, 0o700, dir_fd=root_fd)
    except FileExistsError:
        return
    os.chmod(key, 0o1777, dir_fd=root_fd)  # noqa: S103 - a private /tmp, as the tmpfs root


@dataclass(frozen=True)
class GitUpper:
    """One git overlay's private directories for one spawn."""

    upper: str
    work: str


# Run with a dead executor's state dir before the sweep removes it, so a git import that the
# kill interrupted can be finished or rolled back from its journal first (`recover(state_dir)`
# of the git import registers here). A hook that raises keeps the dir for the next sweep.
def _recover_git_imports(path: str) -> None:
    """A dead executor's git imports first: a journal rolled forward or back, a command's
    commits still only in its overlay imported into keep-refs (never swept unimported)."""
    from bash_sandbox.git_import import recover

    if not recover(path):
        raise RuntimeError(f"git imports of {path} not recovered yet")


def _settle_git_left(path: str) -> None:
    """What a dead executor's running commands left for host git: the repositories they
    created reset and the `.git` entries they re-pointed put back (`git_settle_record.py`)."""
    from bash_sandbox import git_settle_record
    from bash_sandbox.git_spawn import recover_git

    alive_until = git_settle_record.alive_until_ns(path)
    for record, before, roots in git_settle_record.left(path):
        done = recover_git(before, roots, alive_until, git_settle_record.started_ns(record))
        for warning in done.warnings:
            logger.warning("a killed executor's command: %s", warning)
        git_settle_record.drop(record)


STALE_STATE_HOOKS: list[Callable[[str], None]] = [_settle_git_left, _recover_git_imports]


def _hooks_done(path: str) -> bool:
    for hook in STALE_STATE_HOOKS:
        try:
            hook(path)
        except Exception:  # any failure keeps the state for a later sweep
            return False
    return True


def recover_stale(path: str) -> bool:
    """Run the stale-state hooks on a dead executor's state dir, whose lock the caller holds
    (what `sweep_stale` does before removing it); True when it may be removed."""
    return _hooks_done(path)


# A state dir without its lock file this old is a leftover from before locks (or a crash
# between mkdtemp and the lock, which takes microseconds).
_UNLOCKED_GRACE_S = 600
_LOCK = "lock"
# A state dir whose recovery failed (its import still refused: a full disk) is tried again
# by a later sweep, not by every executor's start.
_RETRY = "recovery-failed"
_RETRY_AFTER_S = 60


@functools.lru_cache(maxsize=16)
def _bases_within(bases: tuple[str, ...], roots: tuple[str, ...]) -> tuple[str, ...]:
    """The recorded ``bases`` inside ``roots`` (kept: the same hundreds asked each spawn)."""
    return tuple(b for b in bases if within_any(b, roots))


def sweep_stale(parent: str) -> None:
    """Remove the state dirs in ``parent`` that no live executor holds: an executor killed
    outright (SIGKILL, a crash) cannot remove its own. Each live one holds an exclusive
    lock on its `lock` file for its lifetime, so a lock we can take means its owner is gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith("exec-"):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, _LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - os.lstat(path).st_mtime > _UNLOCKED_GRACE_S and _hooks_done(path):
                    remove_tree(path)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: a live executor
        try:
            # Still locked by us: no other sweeper runs the hooks on it at the same time.
            if _failed_lately(path):
                continue  # its recovery failed a moment ago (a disk still full)
            if _hooks_done(path):
                remove_tree(path)
            else:
                _mark_failed(path)
        finally:
            os.close(fd)


def _failed_lately(path: str) -> bool:
    try:
        return time.time() - os.lstat(os.path.join(path, _RETRY)).st_mtime < _RETRY_AFTER_S
    except OSError:
        return False


def _mark_failed(path: str) -> None:
    marker = os.path.join(path, _RETRY)
    with contextlib.suppress(OSError):
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.utime(marker)


def _unimported(base: str) -> bool:
    """Whether the import of the upper layer in ``base`` found the command's objects could
    not reach the host (`ImportResult.unimported`): the layer is their only copy."""
    from bash_sandbox.git_import.importer import IMPORT_DIR, UNIMPORTED

    return os.path.exists(os.path.join(base, IMPORT_DIR, UNIMPORTED))


# Upper layers kept for unimported commits (`exec-kept-*`) per uid's state parent when the
# host had room for them (git refused the objects themselves, or a quota did): each holds at
# most a command's git cap and costs a failed fetch a minute, so a command cannot leave one
# per run without bound (a first import past it is refused, and says why; concurrent
# imports may pass it by their number). What a full disk refused is kept regardless.
KEPT_MAX = 8
_KEPT_PREFIX = "exec-kept-"


def room_to_keep(upper: str) -> bool:
    """Whether the upper layer at ``upper`` (`<parent>/exec-*/git/<n>/upper`) may be kept
    when its objects do not reach the host: fewer than `KEPT_MAX` are kept in its parent."""
    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(upper))))
    try:
        kept = sum(name.startswith(_KEPT_PREFIX) for name in os.listdir(parent))
    except OSError:
        return False
    return kept < KEPT_MAX


def _keep_unimported(base: str, parent: str) -> None:
    """Move an upper layer whose objects never reached the host (a full disk) out of the
    executor's state, into a state directory of its own in ``parent`` (`exec-kept-*`): no
    executor holds its lock, so a later executor's sweep treats it as a dead executor's,
    and `recover` imports its commits into keep-refs once git takes them; only then is it
    removed. Its lock is held while it is filled: no sweep sees it half made."""
    kept = tempfile.mkdtemp(prefix=_KEPT_PREFIX, dir=parent)
    fd = os.open(os.path.join(kept, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.mkdir(os.path.join(kept, "git"), 0o700)
        os.rename(base, os.path.join(kept, "git", "1"))
    except OSError:
        remove_tree(kept)  # not moved: it stays in the executor's state, swept with it
    finally:
        os.close(fd)


_SPARE_MAX = 4  # empty uppers kept per executor (one per concurrent spawn in a repository)
# The only attribute an overlay mount leaves on an upper it did not write to: its fsid.
_OVERLAY_UUID = frozenset({"trusted.overlay.uuid", "user.overlay.uuid"})


def _emptied(upper: GitUpper) -> bool:
    """Whether the command left ``upper`` exactly as it was made: no entry, no attribute
    but the overlay's own uuid, the directory's mode and owner unchanged (an overlay's root
    takes them from its upper), and nothing beside the import's intent; the overlay's work
    directories are emptied on the way (never reused when that fails)."""
    try:
        st = os.lstat(upper.upper)
        if (
            os.listdir(upper.upper)
            or not set(os.listxattr(upper.upper, follow_symlinks=False)) <= _OVERLAY_UUID
            or st.st_mode != stat.S_IFDIR | 0o755
            or (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid())
        ):
            return False
        imports = os.path.join(os.path.dirname(upper.upper), "import")
        if not set(os.listdir(imports)) <= {"intent.json"}:
            return False
        for name in os.listdir(upper.work):
            os.rmdir(os.path.join(upper.work, name))  # overlay's own `work` and `index`
    except OSError:
        return False
    return True


class ExecutorState:
    """One executor's private state directory, held by descriptor and checked per spawn."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        parent = state_parent(roots)
        sweep_stale(parent)
        self.path = tempfile.mkdtemp(prefix="exec-", dir=parent)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        # Held for the executor's lifetime (closed by the kernel when it dies): `sweep_stale`.
        # Locked under another name, then renamed: a sweeper never sees an unlocked `lock`.
        locking = os.path.join(self.path, _LOCK + ".new")
        self._lock = os.open(
            locking, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.rename(locking, os.path.join(self.path, _LOCK))
        st = os.fstat(self._fd)
        self._identity = (st.st_dev, st.st_ino)
        for name in ("tmp", "shm", "pts", "git", "stage", "landlock-tmp"):
            os.mkdir(os.path.join(self.path, name), 0o700)
        self.scratch = ScratchPaths(
            tmp=os.path.join(self.path, "tmp"),
            shm=os.path.join(self.path, "shm"),
            pts=os.path.join(self.path, "pts"),
        )
        # Landlock alone has no mount namespace: its TMPDIR is a private directory here.
        self.private_tmpdir = os.path.join(self.path, "landlock-tmp")
        self.stage = os.path.join(self.path, "stage")
        self.sources: PlaceholderSources = make_placeholder_sources(self.path)
        self._uppers = 0
        # Uppers a command left exactly as made, for the next spawn (`recycle_upper`).
        self._spare: list[GitUpper] = []
        self._spare_lock = threading.Lock()

    def hidden_paths(self, roots: tuple[str, ...] = ()) -> tuple[str, ...]:
        """What no confined command may see: this uid's base (every executor's state and
        spills), this state dir when it lives elsewhere, every spill parent recorded in the
        fixed bases, whichever executor and `TMPDIR` recorded it (a result names its spill
        path, so a model knows it: unlistable dirs are not enough), the fixed bases, and
        the other bases recorded inside ``roots``."""
        base = os.path.realpath(user_base_dir())
        paths = [base]
        parent = os.path.dirname(self.path)
        if not within(parent, base):
            paths.append(parent)
        paths += recorded_spill_parents()
        # The fixed bases (where every base and root is recorded), and every other
        # executor's base inside this call's ``roots``: under another TMPDIR it may lie
        # there, and a command would plant state a later executor recovers. (Only those:
        # a machine that ran a test suite has hundreds, each a mount.)
        paths += fixed_bases()
        if roots:
            paths += _bases_within(recorded_bases(), roots)
        return tuple(dict.fromkeys(paths))

    def check(self, policy: SandboxPolicy) -> None:
        """Refuse the spawn unless the state is intact and outside this call's roots."""
        try:
            st = os.lstat(self.path)
        except OSError as exc:
            raise SandboxUnavailableError(policy.mode, f"executor state missing: {exc}") from exc
        if (
            (st.st_dev, st.st_ino) != self._identity
            or not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & 0o077
        ):
            raise SandboxUnavailableError(
                policy.mode, f"executor state {self.path} was replaced or opened to others"
            )
        roots = policy.all_writable_roots()
        for root in roots:
            held = next(
                (b for b in (self.path, user_base_dir(), *fixed_bases()) if within(b, root)),
                None,
            )
            if held is not None:
                # The request's own choice, not the host's inability (a harness told
                # "unavailable" widens the mode): a request error.
                raise InvalidRequestError(
                    f"writable root {root} holds bash-sandbox's private state ({held}): a "
                    "command could redirect the next spawn; "
                    "use a narrower writable root"
                )
        # Recorded before the command runs: no executor of this uid takes its base there.
        record_roots(roots)

    def scratch_for(self, policy: SandboxPolicy, ns: NamespaceFds) -> ScratchPaths:
        """The private /tmp and /dev/shm of ``policy``'s trust domain: a directory of that
        name in each tmpfs (made through the namespace's descriptors: the tmpfs is mounted
        only in the executor's mount namespace), where the backends find it by path."""
        key = domain_key(policy)
        for fd in (ns.tmp, ns.shm):
            _make_scratch(key, fd)
        return ScratchPaths(
            tmp=os.path.join(self.scratch.tmp, key),
            shm=os.path.join(self.scratch.shm, key),
            pts=self.scratch.pts,
            domain=key,
        )

    def tmpdir_for(self, policy: SandboxPolicy) -> str:
        """The private TMPDIR of ``policy``'s trust domain for backends without mounts."""
        path = os.path.join(self.private_tmpdir, domain_key(policy))
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        return path

    def git_upper(self) -> GitUpper:
        """Upper and work directories for one git overlay of one spawn: one an earlier
        spawn left empty (`recycle_upper`), else fresh ones."""
        with self._spare_lock:
            if self._spare:
                return self._spare.pop()
        self._uppers += 1
        base = os.path.join(self.path, "git", str(self._uppers))
        os.mkdir(base, 0o700)
        upper, work = os.path.join(base, "upper"), os.path.join(base, "work")
        os.mkdir(upper, 0o755)
        os.chmod(upper, 0o755)  # noqa: S103 - exactly: `_emptied` compares it (umask)
        os.mkdir(work, 0o700)
        return GitUpper(upper, work)

    def recycle_upper(self, upper: GitUpper, placeholders: tuple[str, ...]) -> None:
        """After the import: keep ``upper`` for the next spawn when the command left nothing
        in it (`_emptied`), else remove it. Making and removing the 5 directories costs a
        spawn 0.5 ms of disk work here; an overlay's work directory is emptied for the next
        mount, as the kernel would do at mount time."""
        base = os.path.dirname(upper.upper)
        if _unimported(base):
            _keep_unimported(base, os.path.dirname(self.path))
            return
        if not placeholders and _emptied(upper):
            with self._spare_lock:
                if len(self._spare) < _SPARE_MAX:
                    self._spare.append(upper)
                    return
        remove_tree(base)

    def remove(self) -> None:
        # An upper layer whose objects never reached the host outlives the executor.
        with contextlib.suppress(OSError):
            for name in os.listdir(os.path.join(self.path, "git")):
                base = os.path.join(self.path, "git", name)
                if _unimported(base):
                    _keep_unimported(base, os.path.dirname(self.path))
        remove_tree(self.path)
        for fd in (self._fd, self._lock):
            with contextlib.suppress(OSError):
                os.close(fd)
