"""The write watch: a denial for every change to the tree that the command's view refuses,
seen by the supervisor, never read from the command's output.

The supervised filter hands over every write-intent open (a write flag, tested in BPF: reads
and exec never trap) and every call that changes the tree. The supervisor decides nothing
here: every such call continues to the kernel, which alone allows or refuses it, so a
second thread changing the path after the check can at most mislabel its own attempt. What
the supervisor records is the kernel's own answer for a confined write: both Linux backends
build a view in which everything outside the writable roots (and every protected name
inside them) is a read-only mount, and a write to a read-only mount is refused with EROFS
before anything else (`mnt_want_write`). So a call is a denial when its target (an existing
file it opens for writing or truncates) or its parent directory (what it creates, removes,
renames or links) lies on a mount that is read-only *in the command's view*: resolved in
`/proc/<pid>/root` with `RESOLVE_IN_ROOT`, relative paths against the caller's working
directory or directory descriptor at the time of the call. Under Landlock alone (no mount
namespace, nothing read-only) Landlock refuses with EACCES whatever lies outside the roots
and the private TMPDIR, so there the judge compares the paths with those.

Two steps, so the caller waits only for the first: `capture` (before the call continues:
the path, made absolute with the caller's cwd, a descriptor of its root and one of its
mount namespace, which keeps that view whole until judged) and `judge`
(after: the mount flags, which the call cannot change, since a refused call changed nothing).
Calls whose every path `WritePolicy.surely_writable` clears never reach either step where
the C fast path is built (`fast_writes.py`): it lets them through without waking Python.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bash_sandbox.linux.file_calls import (
    O_CREAT,
    O_EXCL,
    O_NOFOLLOW,
    O_RDWR,
    O_TMPFILE_BIT,
    O_TRUNC,
    O_WRONLY,
    FileCall,
)
from bash_sandbox.linux.proc_paths import (
    PATH_MAX,
    MemoryReader,
    call_path,
    read_cstring,
    signed_int,
)
from bash_seam import DenialEvidence, DenialKind, SandboxDenial
from policies import SandboxMode, SandboxPolicy
from policies.autorun import protected_label
from policies.paths import within

# The same words as the facts' inference, so one marker serves both evidences.
REASON_READ_ONLY = "read-only mode"
REASON_OUTSIDE_ROOTS = "outside the writable roots"
REASON_HELD_READ_ONLY = "held read-only inside a writable root"

_SINKS = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"})
_SYS_OPENAT2 = 437
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_IN_ROOT = 0x10
_MAX_SYMLINKS = 40


def operation_name(call: FileCall) -> str:
    """The call as a user knows it: `openat`/`creat` are an open, `unlinkat` an unlink."""
    if call.write == "open":
        return "open"
    if call.write == "attr":
        return "chmod" if "chmod" in call.name else "chown"
    name = call.name.removesuffix("2")
    return (
        name.removesuffix("at") if name.endswith(("dirat", "nodat", "linkat", "nameat")) else name
    )


@dataclass(frozen=True)
class WritePolicy:
    """What a denial's reason is judged against (the paths as the policy names them)."""

    read_only: bool
    roots: tuple[str, ...]  # the workspace and the writable roots
    protected: tuple[str, ...] = ()  # protected names, relative to each root
    # (device, inode) of the sandbox's own helper (bwrap): its setup runs under the filter
    # too, and what it tries and handles itself is not the command's.
    helpers: frozenset[tuple[int, int]] = frozenset()
    # deny_read paths in or above a root: covered in the view, so never a quick yes.
    hidden: tuple[str, ...] = ()
    # False: a backend without a mount namespace (Landlock alone). No mount is read-only
    # there; Landlock refuses (EACCES) every write outside the roots and ``scratch`` (its
    # private TMPDIR), so the judge compares the paths with those instead.
    view_mounts: bool = True
    scratch: tuple[str, ...] = ()
    # Covered files that are not protected names (what the installed git hooks run), each
    # with the reason a refused write there reports.
    guarded: tuple[tuple[str, str], ...] = ()
    # The placeholders the spawn made for missing protected names (`held_placeholder`).
    placeholders: frozenset[str] = frozenset()

    def allows(self, path: str) -> bool:
        """Landlock alone: whether its rules let ``path`` be written."""
        if path in _SINKS or any(within(path, s) for s in self.scratch):
            return True
        return not self.read_only and any(within(path, r) for r in self.roots)

    def surely_writable(self, path: str) -> bool:
        """Whether the view lets ``path`` be written by construction, so judging it could
        find nothing (the cost of a trap is then only reading its path): inside a writable
        root and clear of every protected name, `.git` (its overlay and placeholders),
        `deny_read` cover and hook-chain cover; the private /tmp and /dev/shm; the sinks. A
        wrong "no" only costs time; a wrong "yes" loses a fact, never a refusal (the kernel
        decides either way)."""
        if "/../" in f"{path}/":
            return False  # the kernel follows a link before `..`: judged in the view
        if not self.view_mounts:
            return self.allows(path)
        if path in _SINKS or within(path, "/dev/shm"):
            return True
        if within(path, "/tmp") and path != "/tmp":
            # The private /tmp, except a host /tmp entry bound back (read-only) for a root.
            top = "/tmp/" + path.split("/")[2]
            if not any(within(root, top) for root in self.roots):
                return True
        if self.read_only:
            return False
        for root in self.roots:
            if within(path, root):
                if self.hidden and any(within(path, h) for h in self.hidden):
                    return False
                if any(within(path, g) for g, _ in self.guarded):
                    return False  # covered for a hook chain: judged, so its reason shows
                rest = path[len(root) :].lstrip("/")
                if rest == ".git" or rest.startswith(".git/") or "/.git/" in f"/{rest}/":
                    return False
                return not any(within(rest, name) for name in self.protected)
        return False


def write_policy(
    policy: SandboxPolicy,
    helper: str | None = None,
    *,
    view_mounts: bool = True,
    scratch: tuple[str, ...] = (),
    guarded: Mapping[str, str] | None = None,
    placeholders: frozenset[str] = frozenset(),
) -> WritePolicy:
    """The judge's view of ``policy`` (a confined one); ``helper``: the backend's binary;
    ``view_mounts`` and ``scratch``: see `WritePolicy`."""
    helpers = set()
    if helper is not None:
        with contextlib.suppress(OSError):
            st = os.stat(helper)
            helpers.add((st.st_dev, st.st_ino))
    roots = tuple(dict.fromkeys((policy.workspace_root, *policy.writable_roots)))
    return WritePolicy(
        read_only=policy.mode is SandboxMode.READ_ONLY,
        roots=roots,
        protected=tuple(policy.protected_paths),
        helpers=frozenset(helpers),
        hidden=_denied_near(tuple(policy.deny_read), roots),
        view_mounts=view_mounts,
        scratch=scratch,
        guarded=tuple((guarded or {}).items()),
        placeholders=placeholders,
    )


@functools.lru_cache(maxsize=32)
def _denied_near(deny_read: tuple[str, ...], roots: tuple[str, ...]) -> tuple[str, ...]:
    """The denied paths inside a root or holding one: strings only, so kept for the next
    spawn of the same policy (each of ~80 names against each root was 0.05 ms a spawn)."""
    return tuple(h for h in deny_read if any(within(h, r) or within(r, h) for r in roots))


@dataclass
class Captured:
    """What `judge` needs, taken while the caller still waits."""

    call: FileCall
    pid: int
    root: int  # O_PATH descriptor of the caller's root (its mount namespace's view)
    paths: tuple[str, ...]  # absolute, in the caller's view: the path, then the new name
    flags: int
    namespace: int  # the caller's mount namespace, held until judged (`capture`)

    def close(self) -> None:
        for fd in (self.root, self.namespace):
            with contextlib.suppress(OSError):
                os.close(fd)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def _openat2(
    dirfd: int, path: str, flags: int, resolve: int = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS
) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    fd = int(
        _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def leads_elsewhere(path: str) -> bool:
    """Whether ``path`` (inside a writable root) goes through a symbolic link, on its way or
    as its last component: the kernel may refuse it where the lexical rules see a root (a
    link to /etc), so it is judged. The host resolves it: inside a root the command's view
    is the host's own tree. True where it cannot tell; False without openat2 (the lexical
    rules alone, as before it). The C fast path's `bsf_leads_elsewhere`, line for line."""
    head, _, base = path.rpartition("/")
    try:
        fd = _openat2(_AT_FDCWD, head or "/", os.O_PATH | os.O_DIRECTORY, _RESOLVE_NO_SYMLINKS)
    except OSError as exc:
        return exc.errno != errno.ENOSYS
    try:
        return bool(base) and stat.S_ISLNK(os.stat(base, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def capture(
    call: FileCall,
    pid: int,
    args: tuple[int, ...],
    read: MemoryReader,
    *,
    still_valid: Callable[[], bool],
    policy: WritePolicy,
) -> Captured | None:
    """The call's paths and the caller's root, or None when there is nothing to judge: a
    path the view surely allows, or one that cannot be read (the caller left, a bad
    pointer: the kernel answers those itself)."""
    paths: list[str] = []
    for index, dirfd in ((call.path, call.dirfd), (call.path2, call.dirfd2)):
        if index is None:
            continue
        raw = read_cstring(read, pid, args[index], PATH_MAX)
        if raw is None:
            return None
        base = signed_int(args[dirfd]) if dirfd is not None else None
        path = call_path(pid, base, raw)
        if path is None:
            return None
        paths.append(path)
    if all(policy.surely_writable(p) and not _through_link(p, policy) for p in paths):
        return None
    try:
        # The namespace too: the judge runs after the call continues, and once the last
        # process leaves, a namespace nobody holds loses every mount below its root, where
        # a path in the workspace resolves on the read-only host tree instead.
        namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        os.close(namespace)
        return None
    flags = args[call.flags] if call.flags is not None else O_CREAT | O_WRONLY | O_TRUNC
    captured = Captured(call, pid, root, tuple(paths), flags, namespace)
    if not still_valid():  # the pid was reused: those were another process's paths
        captured.close()
        return None
    return captured


def _through_link(path: str, policy: WritePolicy) -> bool:
    return any(within(path, r) for r in policy.roots) and leads_elsewhere(path)


def _read_only(fd: int) -> bool:
    return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)


def _mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as fh:
        for line in fh:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    return -1


class _Resolved:
    """The parent directory of a view path, and its last component if it exists there."""

    def __init__(self, root: int, path: str, follow: bool) -> None:
        self.parent = -1
        self.target = -1
        self.mode = 0
        try:
            self._walk(root, path, follow)
        except BaseException:
            self._close()
            raise

    def _walk(self, root: int, path: str, follow: bool) -> None:
        name = path
        for _ in range(_MAX_SYMLINKS):
            head, _, base = name.rstrip("/").rpartition("/")
            self._close()
            self.parent = _openat2(root, head or "/", os.O_PATH | os.O_DIRECTORY)
            if base in ("", ".", ".."):
                self.target = os.dup(self.parent)
                self.mode = stat.S_IFDIR
                return
            try:
                st = os.stat(base, dir_fd=self.parent, follow_symlinks=False)
            except FileNotFoundError:
                return
            if follow and stat.S_ISLNK(st.st_mode):
                link = os.readlink(base, dir_fd=self.parent)
                name = link if link.startswith("/") else f"{head}/{link}"
                continue
            self.target = _openat2(self.parent, base, os.O_PATH | os.O_NOFOLLOW)
            self.mode = st.st_mode
            return
        raise OSError(errno.ELOOP, "too many symbolic links")

    @property
    def exists(self) -> bool:
        return self.target >= 0

    def _close(self) -> None:
        for fd in (self.parent, self.target):
            if fd >= 0:
                os.close(fd)
        self.parent = self.target = -1

    def close(self) -> None:
        self._close()


def _refused_by_rules(captured: Captured, policy: WritePolicy) -> bool:
    """Landlock alone: whether its rules refuse this call (EACCES)."""
    call, flags, path = captured.call, captured.flags, captured.paths[-1]
    parent = os.path.dirname(path.rstrip("/")) or "/"
    if call.write == "open":
        found = _Resolved(captured.root, captured.paths[0], not flags & O_NOFOLLOW)
        try:
            if found.exists:
                writes = flags & (O_WRONLY | O_RDWR | O_TRUNC)
                return bool(writes) and stat.S_ISREG(found.mode) and not policy.allows(path)
            return bool(flags & (O_CREAT | O_TMPFILE_BIT)) and not policy.allows(parent)
        finally:
            found.close()
    if call.write in ("truncate", "attr"):
        return not policy.allows(path)
    return not all(policy.allows(os.path.dirname(p.rstrip("/")) or "/") for p in captured.paths)


def _refused(captured: Captured, policy: WritePolicy | None = None) -> bool:
    """Whether the kernel answers this call EROFS in the caller's view (module doc), or,
    for a missing protected file held by a read-only placeholder directory, EISDIR."""
    call, root, flags = captured.call, captured.root, captured.flags
    kind = call.write
    if kind == "open":
        follow = not (flags & O_NOFOLLOW or (flags & O_CREAT and flags & O_EXCL))
        found = _Resolved(root, captured.paths[0], follow)
        try:
            if flags & O_TMPFILE_BIT:
                return found.exists and _read_only(found.target)
            if found.exists:
                writes = flags & (O_WRONLY | O_RDWR | O_TRUNC)
                if (
                    writes
                    and stat.S_ISDIR(found.mode)
                    and policy is not None
                    and _placeholder_name(captured.paths[0], policy)
                ):
                    return _read_only(found.target)
                # Devices, fifos and sockets open for writing on a read-only mount.
                return bool(writes) and stat.S_ISREG(found.mode) and _read_only(found.target)
            return bool(flags & O_CREAT) and _read_only(found.parent)
        finally:
            found.close()
    if kind == "truncate":
        found = _Resolved(root, captured.paths[0], True)
        try:
            return found.exists and stat.S_ISREG(found.mode) and _read_only(found.target)
        finally:
            found.close()
    if kind == "attr":
        # Any kind of file: a mode or owner is the inode's, refused on a read-only mount.
        found = _Resolved(root, captured.paths[0], _follows(captured.call))
        try:
            return found.exists and _read_only(found.target)
        finally:
            found.close()
    if kind == "create":
        found = _Resolved(root, captured.paths[0], False)
        try:
            return not found.exists and _read_only(found.parent)  # else EEXIST first
        finally:
            found.close()
    if kind == "remove":
        found = _Resolved(root, captured.paths[0], False)
        try:
            if _read_only(found.parent):
                return True  # before the lookup: also for a missing name
            # A name covered where it lies is a mount point: EBUSY (a protected directory
            # the user has, its refused removal without a denial: a red team's).
            return found.exists and _read_only(found.target)
        finally:
            found.close()
    # rename: across two mounts EXDEV comes first. link: the new name is made first (an
    # existing one is EEXIST, a read-only mount EROFS), and only then are the mounts
    # compared (do_linkat), so `ln x dirlink/y` out of a root is EROFS, not EXDEV.
    old = _Resolved(root, captured.paths[0], False)
    try:
        new = _Resolved(root, captured.paths[1], False)
        try:
            if kind == "link":
                return old.exists and not new.exists and _read_only(new.parent)
            if old.parent < 0 or _mount_id(old.parent) != _mount_id(new.parent):
                return False
            if _read_only(new.parent):
                return True
            # A name covered where it lies is a mount point, either side: EBUSY (git's
            # `config.lock` renamed over the covered `.git/config`, refused without a
            # denial: a usability pass).
            # Only once the source was found: a missing one is ENOENT first.
            return old.exists and any(end.exists and _read_only(end.target) for end in (old, new))
        finally:
            new.close()
    finally:
        old.close()


AT_REMOVEDIR = 0x200


def _follows(call: FileCall) -> bool:
    """Whether a mode or owner change follows a link at the end (`lchown` does not; the
    `at` calls' no-follow flag is not read: a link and its target on one read-only mount
    are the same answer)."""
    return call.name != "lchown"


def held_placeholder(captured: Captured, args: tuple[int, ...], policy: WritePolicy) -> bool:
    """Whether the call removes a placeholder the spawn made for a missing protected name
    (an empty directory or file under a mount): the kernel would answer EBUSY, and `git clean -fdx`
    (or `rm -rf .[!.]*`) then failed on every one of them and exited 1 (a usability pass).
    The caller answers it as done without running it: the name stays held, the host never
    had it, and a thread rewriting the path after this check changes nothing, since the
    call never runs. Not a directory the user has there (a red team's: its refused removal
    then left no denial)."""
    call = captured.call
    if call.write != "remove" or captured.paths[0] not in policy.placeholders:
        return False
    removes_dir = call.name == "rmdir" or (call.name == "unlinkat" and bool(args[2] & AT_REMOVEDIR))
    try:
        # Unreadable (the command made a directory on the way unsearchable, as a user's
        # executor cannot search it): not a placeholder of ours to answer (a red team's
        # raised here, and each call's captured descriptors leaked).
        found = _Resolved(captured.root, captured.paths[0], False)
    except OSError:
        return False
    try:
        if not (found.exists and _read_only(found.target)):
            return False
        if not removes_dir:  # `unlink` of an empty file placeholder (`sitecustomize.py`)
            return stat.S_ISREG(found.mode) and os.fstat(found.target).st_size == 0
        if not stat.S_ISDIR(found.mode):
            return False
        return not os.listdir(f"/proc/self/fd/{found.target}")
    except OSError:
        return False
    finally:
        found.close()


def _placeholder_name(path: str, policy: WritePolicy) -> bool:
    """Whether ``path`` is a protected name itself (where a missing one is held by a
    placeholder directory), or a covered path a missing one of which is held the same way
    (what a hook or an `.envrc` loads), not a file below one."""
    return any(path == g for g, _ in policy.guarded) or any(
        path == os.path.join(r, name) for r in policy.roots for name in policy.protected
    )


def _reason(target: str, policy: WritePolicy) -> str:
    roots = [r for r in policy.roots if within(target, r)]
    if not roots:
        return REASON_OUTSIDE_ROOTS
    if policy.read_only:
        return REASON_READ_ONLY
    for path, why in policy.guarded:
        if within(target, path):
            return why
    for root in roots:
        for name in policy.protected:
            if within(target, os.path.join(root, name)):
                return protected_label(name)
    return REASON_HELD_READ_ONLY


def _is_helper(pid: int, policy: WritePolicy) -> bool:
    if not policy.helpers:
        return False
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in policy.helpers


def judge(captured: Captured, policy: WritePolicy) -> SandboxDenial | None:
    """The denial this call is, if its view refuses it (closes ``captured``)."""
    try:
        refused = (
            _refused(captured, policy)
            if policy.view_mounts
            else _refused_by_rules(captured, policy)
        )
    except OSError:
        refused = False  # the path is gone or unreachable: not a read-only mount's answer
    finally:
        captured.close()
    if not refused or _is_helper(captured.pid, policy):
        return None
    target = captured.paths[-1] if captured.call.write in ("rename", "link") else captured.paths[0]
    if captured.call.write == "rename" and _reason(target, policy) == REASON_HELD_READ_ONLY:
        # Moving a covered name away (`mv .git/config x`): the name it takes is not the one
        # held; the one it leaves is.
        source = captured.paths[0]
        if _reason(source, policy) != REASON_HELD_READ_ONLY:
            target = source
    if any(within(target, r) for r in policy.roots):
        # Through a link inside a root (host and view agree there): where it really led. A
        # call that does not follow its last component (unlink, rename) names the link.
        follows = (
            captured.call.write in ("open", "truncate") and not captured.flags & O_NOFOLLOW
        ) or (captured.call.write == "attr" and _follows(captured.call))
        head, base = os.path.split(target)
        target = os.path.realpath(target) if follows else os.path.join(os.path.realpath(head), base)
    operation = operation_name(captured.call)
    return SandboxDenial(
        kind=DenialKind.FILE_WRITE,
        target=target,
        operation=operation,
        reason=_reason(target, policy),
        evidence=DenialEvidence.SUPERVISOR,
    )
