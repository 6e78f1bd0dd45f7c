"""Applying an import to the host repository as one transaction, and recovering one a crash
cut short.

Order (each step durable before the next): the objects are already in the host's store and
the command's commits held by keep-refs (`refs/bash-sandbox/<run>/...`, written by `git
fetch`); then a journal in the executor's state names every planned change; the new index is
put beside the host's and linked to `index.lock` (git's lock: `link` fails on an existing
name as `O_EXCL` does, so a lock the host holds is a conflict); the refs move in one `git
update-ref --stdin` transaction, each a compare-and-swap against the value the command
started from (a fast-forward's: the host's value it descends from); the journal records
that; then `HEAD` (under `HEAD.lock`), the index (the lock renamed into place) and the state
files and reflogs, each only over the host's copy the plan saw (its digest is journaled; one
the host wrote since stays, with the keep-refs of what ours named); the keep-refs go last,
and the journal.

`recover()` finishes or undoes what a killed executor left: once the refs moved (or the
journal says they did) it rolls forward, each step again a compare-and-swap; before that it
rolls back (our index lock removed, recognised by its inode). It never deletes a keep-ref
whose commits no branch holds, so the only copy of a commit is never lost.

`CRASH_POINT` (or the environment variable of the same name) names a write point at which
the process exits on the spot: the crash-injection tests kill the import at each in turn.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from bash_sandbox.git_discovery import is_git_directory
from bash_sandbox.git_import import state_files as sf
from bash_sandbox.git_import.gitcmd import GitError, git
from policies.paths import within

# Where the command's commits are kept until they land (`refs/bash-sandbox/<run>/...`).
KEEP_NAMESPACE = "refs/bash-sandbox"

CRASH_ENV = "BASH_SANDBOX_GIT_IMPORT_CRASH"
# Set by tests in-process; the environment variable is read at each write point, never at
# import (the warm daemon imports this once, with the environment of whoever started it).
CRASH_POINT: str | None = None
WRITE_POINTS = (
    "objects",  # after the fetch: objects and keep-refs on the host
    "journal",
    "index-lock",
    "refs",
    "head-lock",
    "head",
    "index",
    "files",
    "keep-refs",
)
JOURNAL = "journal.json"
ZERO = "0" * 40


def crash_point(name: str) -> None:
    """Exit on the spot when the crash-injection hook names this write point."""
    if name == (CRASH_POINT or os.environ.get(CRASH_ENV) or None):
        os._exit(86)


@dataclass
class RefChange:
    name: str
    new: str | None  # None: delete
    old: str | None  # None: must not exist


@dataclass
class FileChange:
    admin: str  # "" or "worktrees/<name>"
    rel: str  # `HEAD`, `MERGE_MSG`, `rebase-merge` (a directory), ...
    source: str | None  # the checked copy in the work dir; None: remove on the host
    is_dir: bool = False
    # `state_digest` of the host's copy when the plan was made, and of what the plan writes
    # (None in a journal written before they were: written unchecked, as then).
    before: str | None = None
    after: str | None = None
    reflog: bool = False  # a reflog: the import's own ref update appends to it first
    # Keep-refs holding objects only this change names: they stay when it is not written.
    keeps: list[str] = field(default_factory=list)


@dataclass
class IndexChange:
    admin: str
    source: str  # the rebuilt index in the work dir
    tmp_name: str  # its copy beside the host's index, linked to `index.lock`


@dataclass
class Journal:
    gitdir: str
    run_id: str
    keep_prefix: str
    keep_refs: dict[str, str]  # keep-ref -> object id
    refs: list[RefChange] = field(default_factory=list)
    heads: list[FileChange] = field(default_factory=list)
    indexes: list[IndexChange] = field(default_factory=list)
    files: list[FileChange] = field(default_factory=list)
    old_heads: dict[str, str | None] = field(default_factory=dict)  # admin -> raw HEAD at start
    committed: bool = False

    @classmethod
    def load(cls, path: str) -> Journal:
        with open(path) as fh:
            raw = json.load(fh)
        raw["refs"] = [RefChange(**r) for r in raw["refs"]]
        raw["heads"] = [FileChange(**r) for r in raw["heads"]]
        raw["indexes"] = [IndexChange(**r) for r in raw["indexes"]]
        raw["files"] = [FileChange(**r) for r in raw["files"]]
        return cls(**raw)

    def save(self, path: str) -> None:
        _durable_write(path, json.dumps(asdict(self)).encode())


def own_messages(run_id: str) -> tuple[str, str]:
    """The reflog messages of this import's own ref updates (the transaction, a recovery)."""
    return f"bash-sandbox: import of {run_id}", f"bash-sandbox: recovery of {run_id}"


class Conflict(Exception):
    """A lock the host holds, or a value the host changed: nothing of the repository applied."""

    def __init__(self, name: str, host: str | None, command: str | None) -> None:
        self.name, self.host, self.command = name, host, command
        super().__init__(f"{name}: the host holds {host}, the command has {command}")


# -- files, durably and never through a link -------------------------------------------------


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def _dir_fd(gitdir: str, admin: str) -> Iterator[int]:
    """The admin dir below ``gitdir``, opened one component at a time without links."""
    fd = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in [p for p in admin.split("/") if p]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _copy_into(dir_fd: int, name: str, source: str, *, exclusive: bool = False) -> None:
    """Stream ``source`` into a new file ``name`` of ``dir_fd``, synced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_EXCL if exclusive else os.O_TRUNC
    out = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        with open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                _write_all(out, chunk)
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(out)


def _replace(dir_fd: int, name: str, source: str, tag: str) -> None:
    tmp = f".bash-sandbox-{tag}-{name}"
    _copy_into(dir_fd, tmp, source)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _remove_at(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            _remove_at(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _temp_names(tag: str, name: str) -> tuple[str, str]:
    """Our copy built beside ``name``, and where the host's is moved aside before it goes."""
    flat = name.replace("/", "-")
    return f".bash-sandbox-{tag}-{flat}", f".bash-sandbox-{tag}-old-{flat}"


def _replace_dir(dir_fd: int, name: str, source: str, tag: str) -> None:
    """Swap in a checked state directory: built beside it, the old one moved aside (one
    rename, so a kill never leaves it half removed), ours renamed in, the old one removed."""
    tmp, aside = _temp_names(tag, name)
    _remove_at(dir_fd, tmp)
    os.mkdir(tmp, 0o755, dir_fd=dir_fd)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for entry in sorted(os.listdir(source)):
            _copy_into(fd, entry, os.path.join(source, entry))
        os.fsync(fd)
    finally:
        os.close(fd)
    _move_aside(dir_fd, name, aside)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    _remove_at(dir_fd, aside)


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _move_aside(dir_fd: int, name: str, aside: str) -> None:
    _remove_at(dir_fd, aside)
    with contextlib.suppress(FileNotFoundError):
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


# -- what the host holds, as one string -------------------------------------------------------

ABSENT = "absent"
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def content_digest(data: bytes, *, reflog_of: str | None = None) -> str:
    """`state_digest` of a file holding ``data``. ``reflog_of``: the file is a reflog, and
    the trailing entries that run's own ref updates appended are left out (git appends them
    to the reflogs of the refs it moves, before the import writes its own copy); an empty
    reflog is as good as none."""
    if reflog_of is not None:
        own = tuple(f"\t{m}".encode() for m in own_messages(reflog_of))
        lines = data.split(b"\n")
        while lines and (not lines[-1] or lines[-1].endswith(own)):
            lines.pop()
        if not lines:
            return ABSENT
        data = b"\n".join(lines) + b"\n"
    return "file:" + hashlib.sha256(data).hexdigest()


def state_digest(dir_fd: int, name: str, *, reflog_of: str | None = None) -> str:
    """What ``name`` of ``dir_fd`` holds, never through a link: `absent`, a file's content
    hash, a directory's hash of its names and their digests, a link's target."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(name, dir_fd=dir_fd)
    if stat.S_ISREG(st.st_mode):
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "rb", closefd=False) as fh:
                if reflog_of is not None:
                    return content_digest(fh.read(), reflog_of=reflog_of)
                h = hashlib.sha256()
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        finally:
            os.close(fd)
        return "file:" + h.hexdigest()
    if not stat.S_ISDIR(st.st_mode):
        return f"other:{stat.S_IFMT(st.st_mode):o}"  # a FIFO is never opened
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        h = hashlib.sha256()
        for entry in sorted(os.listdir(fd)):
            h.update(f"{entry}\0{state_digest(fd, entry)}\0".encode(errors="surrogateescape"))
    finally:
        os.close(fd)
    return "dir:" + h.hexdigest()


def path_digest(path: str, *, reflog_of: str | None = None) -> str:
    """`state_digest` of ``path`` (its parent reached as the kernel finds it)."""
    try:
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    try:
        return state_digest(fd, os.path.basename(path), reflog_of=reflog_of)
    finally:
        os.close(fd)


# -- refs ------------------------------------------------------------------------------------


def host_refs(gitdir: str) -> dict[str, str]:
    """Every ref git reads in ``gitdir`` and the object it names; symbolic refs (a remote's
    `HEAD`) left out: they name a ref, and move with it."""
    out = git(gitdir, "for-each-ref", "--format=%(objectname)%00%(symref)%00%(refname)").stdout
    refs: dict[str, str] = {}
    for line in out.decode(errors="surrogateescape").splitlines():
        oid, symref, name = line.split("\0", 2)
        if not symref:
            refs[name] = oid
    return refs


def _update_refs(gitdir: str, changes: list[RefChange], message: str, zero: str) -> None:
    """One `git update-ref --stdin` transaction; raises GitError when any CAS fails or a
    lock is held (git then applies none of it)."""
    lines = ["start"]
    for c in changes:
        if c.new is None:
            lines.append(f"delete {c.name} {c.old or zero}")
        else:
            lines.append(f"update {c.name} {c.new} {c.old or zero}")
    lines += ["prepare", "commit", ""]
    git(gitdir, "update-ref", "-m", message, "--stdin", input="\n".join(lines).encode())


def _head_raw(gitdir: str, admin: str) -> str | None:
    try:
        with open(os.path.join(gitdir, admin, "HEAD"), "rb") as fh:
            return fh.read(4096).decode(errors="replace")
    except OSError:
        return None


# -- the transaction -------------------------------------------------------------------------


def take_index_locks(journal: Journal) -> None:
    """Put each rebuilt index beside the host's and link it to `index.lock`; a lock the host
    holds is a conflict (the ones taken so far are given back)."""
    taken: list[IndexChange] = []
    try:
        for change in journal.indexes:
            with _dir_fd(journal.gitdir, change.admin) as fd:
                _remove_at(fd, change.tmp_name)
                _copy_into(fd, change.tmp_name, change.source, exclusive=True)
                try:
                    os.link(change.tmp_name, "index.lock", src_dir_fd=fd, dst_dir_fd=fd)
                except FileExistsError:
                    os.unlink(change.tmp_name, dir_fd=fd)
                    raise Conflict(
                        os.path.join(change.admin, "index.lock"), None, "index"
                    ) from None
                taken.append(change)
            crash_point("index-lock")
    except BaseException:
        release_index_locks(journal.gitdir, taken)
        raise


def _ours(fd: int, tmp_name: str, lock: str = "index.lock") -> bool:
    """Whether ``lock`` is the link we made (same inode as our temp copy)."""
    try:
        a = os.stat(lock, dir_fd=fd, follow_symlinks=False)
        b = os.stat(tmp_name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def release_index_locks(gitdir: str, changes: list[IndexChange]) -> None:
    for change in changes:
        with contextlib.suppress(OSError), _dir_fd(gitdir, change.admin) as fd:
            if _ours(fd, change.tmp_name):
                os.unlink("index.lock", dir_fd=fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(change.tmp_name, dir_fd=fd)


def check_head_locks(journal: Journal) -> None:
    for head in journal.heads:
        if os.path.lexists(os.path.join(journal.gitdir, head.admin, "HEAD.lock")):
            raise Conflict(os.path.join(head.admin, "HEAD.lock"), None, "HEAD")
        now = _head_raw(journal.gitdir, head.admin)
        if now != journal.old_heads.get(head.admin):
            raise Conflict(os.path.join(head.admin, "HEAD"), now, "changed")


def apply(journal: Journal, journal_path: str, zero: str) -> list[str]:
    """Run the transaction from the refs on (the journal is saved; the index locks are
    ours). Returns what landed. Raises Conflict before anything applied."""
    message = own_messages(journal.run_id)[0]
    landed = True
    if journal.refs:
        try:
            _update_refs(journal.gitdir, journal.refs, message, zero)
        except GitError as exc:
            landed = False
            now = host_refs(journal.gitdir)
            if not any(_done(c, now) for c in journal.refs):
                release_index_locks(journal.gitdir, journal.indexes)
                bad = next((c for c in journal.refs if now.get(c.name) != c.old), journal.refs[0])
                raise Conflict(bad.name, now.get(bad.name), bad.new) from exc
            # Part of it moved (a crash inside git's commit): the rest rolls forward.
            _roll_refs_forward(journal, zero)
    crash_point("refs")
    journal.committed = True
    journal.save(journal_path)
    return finish(journal, zero, landed=landed)


def _done(change: RefChange, now: dict[str, str]) -> bool:
    return now.get(change.name) == change.new


def _roll_refs_forward(journal: Journal, zero: str) -> None:
    now = host_refs(journal.gitdir)
    pending = [c for c in journal.refs if not _done(c, now) and now.get(c.name) == c.old]
    if pending:
        _update_refs(journal.gitdir, pending, own_messages(journal.run_id)[1], zero)


def _apply_head(journal: Journal, head: FileChange) -> bool:
    """`HEAD` under git's `HEAD.lock`, taken as the index's is (a link of our temp copy, so
    a recovery tells our lock from the host's by its inode). True once it is ours."""
    assert head.source is not None
    tmp = f".bash-sandbox-{journal.run_id}-HEAD"
    with open(head.source, "rb") as fh:
        wanted = fh.read(4096).decode(errors="replace")
    with _dir_fd(journal.gitdir, head.admin) as fd:
        now = _head_raw(journal.gitdir, head.admin)
        if now == wanted:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            return True
        if now != journal.old_heads.get(head.admin):
            return False  # the host moved HEAD meanwhile: its HEAD wins, ours is kept
        if not _ours(fd, tmp, "HEAD.lock"):
            _remove_at(fd, tmp)
            _copy_into(fd, tmp, head.source, exclusive=True)
            try:
                os.link(tmp, "HEAD.lock", src_dir_fd=fd, dst_dir_fd=fd)
            except FileExistsError:
                os.unlink(tmp, dir_fd=fd)
                return False  # the host's git holds it
            crash_point("head-lock")
        os.rename("HEAD.lock", "HEAD", src_dir_fd=fd, dst_dir_fd=fd)
        os.unlink(tmp, dir_fd=fd)
    return True


def _apply_file(journal: Journal, fd: int, f: FileChange) -> bool:
    """One state file, reflog or directory, written (or removed) only where the host's copy
    is still the one the plan saw; True once the host holds what the plan writes. The host
    may have written it since the plan (a commit after a crash, before the recovery): its
    copy then stays, and so do the keep-refs of what ours named (`keeps`)."""
    tmp, aside = _temp_names(journal.run_id, f.rel)
    reflog_of = journal.run_id if f.reflog else None
    now = state_digest(fd, f.rel, reflog_of=reflog_of)
    if (
        now == ABSENT
        and f.is_dir
        and f.source is not None
        and _exists_at(fd, aside)
        and state_digest(fd, tmp) == f.after
    ):
        # Killed between moving the host's directory aside and renaming ours in.
        os.rename(tmp, f.rel, src_dir_fd=fd, dst_dir_fd=fd)
        now = f.after
    if f.after is None or now != f.after:
        if f.before is not None and now != f.before:
            _remove_at(fd, tmp)
            _remove_at(fd, aside)
            return False
        if f.source is None:
            _move_aside(fd, f.rel, aside)  # one rename: never half removed
        elif f.is_dir:
            _replace_dir(fd, f.rel, f.source, journal.run_id)
        else:
            _replace(fd, f.rel, f.source, journal.run_id)
    _remove_at(fd, tmp)
    _remove_at(fd, aside)
    return True


def finish(journal: Journal, zero: str, *, landed: bool = False) -> list[str]:
    """Everything after the refs, each step idempotent (a recovery runs it again)."""
    applied = [c.name for c in journal.refs]
    kept: set[str] = set()  # keep-refs of what was not written
    for head in journal.heads:
        assert head.source is not None
        if _apply_head(journal, head):
            applied.append(os.path.join(head.admin, "HEAD"))
        else:
            kept.update(head.keeps)
        crash_point("head")
    for change in journal.indexes:
        with _dir_fd(journal.gitdir, change.admin) as fd:
            if _ours(fd, change.tmp_name):
                os.rename("index.lock", "index", src_dir_fd=fd, dst_dir_fd=fd)
                applied.append(os.path.join(change.admin, "index"))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(change.tmp_name, dir_fd=fd)
        crash_point("index")
    for f in journal.files:
        with _dir_fd(journal.gitdir, f.admin) as fd:
            if _apply_file(journal, fd, f):
                applied.append(os.path.join(f.admin, f.rel))
            else:
                kept.update(f.keeps)
        crash_point("files")
    drop_keep_refs(journal, zero, landed=landed, kept=kept)
    return applied


def drop_keep_refs(
    journal: Journal, zero: str, *, landed: bool = False, kept: set[str] | None = None
) -> None:
    """The keep-refs, once every commit they hold is where the command put it (``landed``:
    the transaction moved every ref, nothing to look up; each deletion is a CAS anyway),
    but those in ``kept`` (what a change the host's copy won names)."""
    if not journal.keep_refs:
        return
    kept = kept or set()
    if landed:
        gone = [
            RefChange(name, None, oid)
            for name, oid in journal.keep_refs.items()
            if name not in kept
        ]
    else:
        now = host_refs(journal.gitdir)
        if not all(_done(c, now) for c in journal.refs):
            return  # a ref the host moved meanwhile: its commits stay kept
        gone = [
            RefChange(name, None, oid)
            for name, oid in journal.keep_refs.items()
            if now.get(name) == oid and name not in kept
        ]
    if gone:
        with contextlib.suppress(GitError):
            _update_refs(journal.gitdir, gone, "bash-sandbox: imported", zero)
        # Git removes a deleted ref's empty directories but the namespace's own: an empty
        # `refs/bash-sandbox` was left in every repository an import touched.
        for below in ("", "logs"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(journal.gitdir, below, KEEP_NAMESPACE))
    crash_point("keep-refs")


# -- recovery --------------------------------------------------------------------------------


# What a journal may name: the host repository's admin dirs and the state files the import
# writes (`state_files.py`), each as git's own layout has them.
_JOURNAL_FILES = frozenset(
    {"HEAD", "gitdir", "commondir", "locked", *sf.PSEUDO_REFS, *sf.MESSAGES, *sf.STATE_DIRS}
)


def _safe_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _journal_problem(journal: Journal, work: str) -> str | None:
    """Why a journal found on disk is not one an import wrote, or None. Checked before a
    recovery applies it: a recovery runs in a later executor, which trusts the state dir
    only as far as its own checks go (a command that could write an executor's state
    would otherwise have it write any file, or replace a repository's config)."""
    gitdir = journal.gitdir
    if not os.path.isabs(gitdir) or os.path.realpath(gitdir) != gitdir:
        return f"repository {gitdir!r} is not a real absolute path"
    if not is_git_directory(gitdir):
        return f"{gitdir} is not a git directory"

    def below_admin(admin: str) -> list[str] | None:
        """What follows the admin dir ("" or `worktrees/<name>`) in ``admin``; None when
        ``admin`` is not below one."""
        parts = admin.split("/") if admin else []
        if parts[:1] == ["worktrees"]:
            if len(parts) < 2 or not _safe_name(parts[1]):
                return None
            parts = parts[2:]
        return parts if all(_safe_name(p) for p in parts) else None

    def source_ok(source: str | None) -> bool:
        return source is None or within(os.path.realpath(source), work)

    for change in (*journal.heads, *journal.files):
        rest = below_admin(change.admin)
        parts = change.rel.split("/")
        if rest is None or not all(_safe_name(p) for p in parts) or not source_ok(change.source):
            return f"a change outside the repository's own layout: {change}"
        state_file = rest == [] and parts[0] in _JOURNAL_FILES
        reflog = rest[:1] == ["logs"] and len(parts) == 1  # `logs/<ref dirs>`, the ref's name
        worktree_gone = (
            change.admin == "" and change.source is None and len(parts) == 2
        ) and parts[0] == "worktrees"
        if not (state_file or reflog or worktree_gone):
            return f"a file the import never writes: {change.admin}/{change.rel}"
    for index in journal.indexes:
        below = below_admin(index.admin)
        if not (below == [] and source_ok(index.source) and _safe_name(index.tmp_name)):
            return f"an index change outside the repository's own layout: {index}"
    return None


def recover_journal(path: str) -> str:
    """Finish or undo the transaction ``path`` describes; returns what was done."""
    journal = Journal.load(path)
    problem = _journal_problem(journal, os.path.realpath(os.path.dirname(path)))
    if problem is not None:
        return f"refused: {problem}"
    zero = ZERO if not journal.keep_refs else "0" * len(next(iter(journal.keep_refs.values())))
    if not os.path.isdir(journal.gitdir):
        return "gone"
    now = host_refs(journal.gitdir)
    forward = journal.committed or any(_done(c, now) for c in journal.refs)
    if not forward:
        # Nothing moved: undo the locks; the keep-refs keep the command's commits.
        release_index_locks(journal.gitdir, journal.indexes)
        return "rolled back"
    _roll_refs_forward(journal, zero)
    journal.committed = True
    journal.save(path)
    applied = finish(journal, zero)
    kept = [
        os.path.join(c.admin, c.rel)
        for c in (*journal.heads, *journal.files)
        if os.path.join(c.admin, c.rel) not in applied
    ]
    if kept:
        return f"rolled forward; the host changed these since, its own kept: {', '.join(kept)}"
    return "rolled forward"


def remove_work(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
