"""The import of one command's git state into the host repository (see the package doc)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from bash_sandbox import state as executor_state
from bash_sandbox.git_created import data_pairs, parse_config
from bash_sandbox.git_discovery import DotGit, read_gitfile
from bash_sandbox.git_import import state_files as sf
from bash_sandbox.git_import.gitcmd import SCRATCH_OPTIONS, GitError, git, git_env
from bash_sandbox.git_import.kept_refs import snapshot_refs
from bash_sandbox.git_import.transaction import (
    ABSENT,
    JOURNAL,
    KEEP_NAMESPACE,
    Conflict,
    FileChange,
    IndexChange,
    Journal,
    RefChange,
    apply,
    check_head_locks,
    content_digest,
    crash_point,
    host_refs,
    path_digest,
    recover_journal,
    release_index_locks,
    remove_work,
    take_index_locks,
)
from bash_sandbox.git_import.view import (
    GIT_STATE_CAP_BYTES,
    ScanRefused,
    UpperScan,
    add_admin_head,
    build_view,
    host_objects,
    scan_upper,
)
from bash_sandbox.safe_read import read_regular
from bash_seam import GitImportOutcome, GitImportStatus, GitRefConflict
from policies.paths import within as within_path
from policies.paths import within_any

IMPORT_DIR = "import"
START_DIR = "start"  # beside the upper layer: copies of the indexes the command started from
INTENT = "intent.json"
# Beside the intent when the command's objects never reached the host: its upper layer is
# their only copy (`ImportResult.unimported`; `state.py` keeps it out of the executor's state).
UNIMPORTED = "unimported"
# A one-page write cannot be split by a kill; intents this small are rewritten in place.
_INTENT_PAGE = 4096
_CARRIER = "refs/bash-sandbox-import"
# A linked worktree's links to its checkout and to the common dir (checked on their own).
_WORKTREE_LINKS = frozenset({"gitdir", "commondir", "locked"})
_CONTROL = frozenset({"config", "config.worktree", "commondir", "hooks", "info", "description"})
_GITLINK = "160000"
# Refs a command may move forward from a value the host gave them meanwhile (git's own
# fast-forward rule for branches and remote-tracking refs; a tag never moves that way).
_FAST_FORWARD = ("refs/heads/", "refs/remotes/")
_INTENT_TO_ADD = 1 << 29
# The refs git's rev-parse rules (`ref_rev_parse_rules`) would read for HEAD or a pseudo ref.
_SHADOWING = frozenset(
    rule.format(p)
    for p in ("HEAD", "FETCH_HEAD", *sf.PSEUDO_REFS)
    for rule in (
        "refs/{}",
        "refs/tags/{}",
        "refs/heads/{}",
        "refs/remotes/{}",
        "refs/remotes/{}/HEAD",
    )
)
# A reflog entry the command wrote dated this much before it started still counts as new
# (a clock stepped back); an older one is expired by `git gc` as soon as the host's are.
_CLOCK_SLACK_NS = 86_400 * 1_000_000_000
# One entry of `git ls-files -s -z --debug`: the NUL-terminated line, then git's fixed lines.
_DEBUG_ENTRY = re.compile(
    rb"([^\0]*)\0  ctime: [^\n]*\n  mtime: [^\n]*\n  dev: [^\n]*\n  uid: [^\n]*\n"
    rb"  size: [0-9]+\tflags: ([0-9a-f]+)\n"
)


@dataclass
class Snapshot:
    """The host repository as the command found it: what each change is compared with."""

    gitdir: str
    upper: str
    run_id: str
    refs: dict[str, str] | None  # None: the host's git could not read it as a repository
    heads: dict[str, str | None]  # admin dir ("" or "worktrees/<name>") -> raw HEAD
    indexes: dict[str, list[int] | None]  # admin dir -> identity of its index file
    # Submodules' git directories below `modules/`: their own snapshots (as dicts).
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    taken_ns: int = 0  # when it was taken (0: unknown)
    # The command's writable roots: a new linked worktree, and any worktree (linked or
    # main) whose HEAD, index or state is imported, must lie in one (none recorded, an
    # intent written before they were: neither is taken).
    roots: list[str] = field(default_factory=list)
    # Whether the main checkout of a git dir git cannot place (not bare, not named `.git`,
    # no `core.worktree`: a separate git dir) lies in the roots, as the caller's survey
    # found it (`main_checkout_inside`); None: unknown, taken as outside.
    main_inside: bool | None = None
    # The refs that were loose files (`refs/...`) when it was taken; None: not listed.
    loose: list[str] | None = None
    # admin dir -> a copy of its index as the command started from it (`_keep_start_indexes`).
    start_indexes: dict[str, str] = field(default_factory=dict)


@dataclass
class ImportResult:
    outcome: GitImportOutcome | None = None
    modules: list[GitImportOutcome] = field(default_factory=list)  # submodules' outcomes
    denials: list[tuple[str, str]] = field(default_factory=list)  # (path, why) discarded
    new_gitlinks: list[str] = field(default_factory=list)
    # The command's objects never reached the host (its fetch failed: a full disk, say): the
    # upper layer is their only copy, and its intent stays for a later import.
    unimported: bool = False


def _identity(path: str) -> list[int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _admins(gitdir: str) -> list[str]:
    admins = [""]
    with contextlib.suppress(OSError):
        admins += sorted(
            f"worktrees/{e.name}"
            for e in os.scandir(os.path.join(gitdir, "worktrees"))
            if e.is_dir(follow_symlinks=False)
        )
    return admins


def _read_head(gitdir: str, admin: str) -> str | None:
    try:
        # Not a plain open: a FIFO a command left in a repository it made stalled the loop.
        return read_regular(os.path.join(gitdir, admin, "HEAD"), 4096).decode(errors="replace")
    except OSError:
        return None


def begin(
    gitdir: str, upper: str, roots: Iterable[str] = (), *, main_inside: bool | None = None
) -> Snapshot:
    """Record, before the command starts, the host's refs, HEADs and indexes of ``gitdir``
    (the compare-and-swap values), durably beside ``upper``: a later executor finds it there
    and imports the command's commits even if this one dies. ``roots``: the command's
    writable roots (where a worktree it adds may lie). ``main_inside``: see `Snapshot`."""
    base = os.path.join(os.path.dirname(upper), IMPORT_DIR)
    os.makedirs(base, 0o700, exist_ok=True)
    fan_out(gitdir)
    snap = _take(gitdir, upper, f"{time.time_ns():x}-{os.getpid()}")
    snap.roots = list(roots)
    snap.main_inside = main_inside
    _keep_start_indexes(os.path.join(os.path.dirname(upper), START_DIR), snap)
    for i, rel in enumerate(_module_dirs(gitdir)):
        sub = _take(os.path.join(gitdir, "modules", rel), "", f"{snap.run_id}-m{i}")
        sub.roots = snap.roots
        snap.modules[rel] = asdict(sub)
    _record(base, json.dumps(asdict(snap)).encode())
    return snap


def fan_out(gitdir: str) -> None:
    """Every `objects/xx` directory made on the host before the command starts, empty, as
    git makes them (its mode and owner): one the command's git made first was a directory
    of the overlay's upper layer alone, where an object the host's git wrote later never
    showed (a usability pass: `bad tree object HEAD` in a background command once the user
    committed). Once per repository: git keeps them until `git prune` removes empty ones.
    Never through a link: a repository a command made with `objects` linked to a host
    directory had the executor make 256 directories there, with that directory's owner (a
    red team's); so nothing on the way may be one, and each is made at a descriptor."""
    if os.path.realpath(gitdir) != os.path.normpath(gitdir):
        return
    try:
        fd = os.open(os.path.join(gitdir, "objects"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        present = set(os.listdir(fd))
        owner = (st.st_uid, st.st_gid) if os.geteuid() == 0 else None
        for name in (f"{i:02x}" for i in range(256)):
            if name not in present:
                _fan_out_one(fd, name, stat.S_IMODE(st.st_mode), owner)
    except OSError:
        return  # a full or read-only disk: as before, the command makes what it needs
    finally:
        os.close(fd)


def _fan_out_one(objects: int, name: str, mode: int, owner: tuple[int, int] | None) -> None:
    try:
        os.mkdir(name, 0o700, dir_fd=objects)
    except FileExistsError:
        return
    made = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=objects)
    try:
        os.fchmod(made, mode)
        if owner is not None and owner != (0, 0):
            os.fchown(made, *owner)  # the user's repository, never root's directories
    finally:
        os.close(made)


# Indexes up to this size are copied at the start (a 10,000-file checkout's is about 1 MiB).
_START_INDEX_MAX = 4 << 20


def _keep_start_indexes(base: str, snap: Snapshot) -> None:
    """A copy in ``base`` (made 0700 beside the upper layer: the import's own directory holds
    only the intent while an upper may be reused) of each index the command starts from (up
    to `_START_INDEX_MAX`),
    its identity re-taken from the very descriptor copied: a host `git status` that only
    refreshes stat data replaces the index file, and the import tells that from a change of
    its entries against this copy (`_Importer._index_changed`; an IDE polling `git status`
    made every background command's commit a conflict: a usability pass). Not flushed: a
    crash loses only the copy, and the import then sees any replaced index as changed."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    for n, admin in enumerate(sorted(snap.indexes)):
        dest = os.path.join(base, f"index-{n}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest)
        try:
            fd = os.open(
                os.path.join(snap.gitdir, admin, "index"),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            )
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > _START_INDEX_MAX:
                continue
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read(_START_INDEX_MAX + 1)
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(data)
        except OSError:
            continue
        snap.indexes[admin] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        snap.start_indexes[admin] = dest


def main_checkout_inside(gitdir: str, entries: Iterable[DotGit], roots: Iterable[str]) -> bool:
    """Whether one of ``entries`` (`.git` entries as a survey found them) lying in ``roots``
    is the main checkout of ``gitdir``: a gitfile naming ``gitdir`` itself (read as git reads
    it), not one of its linked worktrees' admin dirs, or a `.git` link resolving to it; taken
    from the survey's snapshot, never read again (a running command may rewrite it). A bare
    repository the search found (no `.git` name) is no checkout. For
    `begin(main_inside=...)`. The caller passes only entries no command could have planted:
    a new one naming an overlaid git dir is removed after its command (`git_spawn.settle_git`),
    and a survey while a command runs keeps those an earlier quiet one found (`host_view`)."""
    target = os.path.realpath(gitdir)
    within = tuple(roots)
    for entry in entries:
        if os.path.basename(entry.path) != ".git":
            continue
        checkout = os.path.realpath(os.path.dirname(entry.path))
        if not within_any(checkout, within):
            continue
        # A directory is a git dir itself; a link or a gitfile leads where the survey saw.
        named = os.path.realpath(entry.path) if entry.kind == "dir" else entry.target
        if named == target:
            return True
    return False


def _record(base: str, body: bytes) -> None:
    """The intent, durable before the command starts. A small one is padded to one page
    (JSON ignores the trailing spaces), so the next spawn on a reused upper overwrites it in
    place and needs only `fdatasync` (no journal commit: begin() 0.35 ms here) where a new
    file and a rename need `fsync` (0.5-0.6 ms). A power loss within that write can only
    tear the intent of a command that has not started (or of the one before it, which left
    the upper empty): unreadable, it is skipped and nothing is lost."""
    path = os.path.join(base, INTENT)
    if len(body) < _INTENT_PAGE:
        body += b" " * (_INTENT_PAGE - 1 - len(body)) + b"\n"
        if _overwritten(path, body):
            return
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)


def _overwritten(path: str, body: bytes) -> bool:
    """Whether ``body`` now lies durably in ``path`` (an intent of its very size, written
    over); False where there is none to write over (then nothing was changed, or a partial
    write that the caller's new file replaces)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size != len(body) or os.pwrite(fd, body, 0) != len(body):
            return False
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return True


def _take(gitdir: str, upper: str, run_id: str) -> Snapshot:
    admins = _admins(gitdir)
    refs: dict[str, str] | None = None
    loose: tuple[str, ...] | None = None
    # Not a repository git can read (yet): nothing to compare with.
    with contextlib.suppress(GitError, subprocess.SubprocessError):
        refs, loose = snapshot_refs(gitdir)
    return Snapshot(
        gitdir=gitdir,
        upper=upper,
        run_id=run_id,
        refs=refs,
        loose=list(loose) if loose is not None else None,
        taken_ns=time.time_ns(),
        heads={a: _read_head(gitdir, a) for a in admins},
        indexes={a: _identity(os.path.join(gitdir, a, "index")) for a in admins},
    )


def _module_dirs(gitdir: str, depth: int = 3) -> list[str]:
    """Submodules' git directories below `modules/` (names may hold slashes)."""
    found: list[str] = []
    level = [""]
    for _ in range(depth):
        below: list[str] = []
        for rel in level:
            with contextlib.suppress(OSError):
                for entry in os.scandir(os.path.join(gitdir, "modules", rel)):
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    sub = os.path.join(rel, entry.name)
                    if os.path.isfile(os.path.join(entry.path, "HEAD")):
                        found.append(sub)
                    else:
                        below.append(sub)
        level = below
    return sorted(found)


def load_snapshot(upper: str) -> Snapshot | None:
    """The intent beside ``upper``; its upper layer is ``upper``, wherever the two were moved
    together (an unimported one kept out of its executor's state, `state.py`)."""
    try:
        with open(os.path.join(os.path.dirname(upper), IMPORT_DIR, INTENT)) as fh:
            return Snapshot(**{**json.load(fh), "upper": upper})
    except (OSError, ValueError, TypeError):
        return None


# -- reading the command's state through git -------------------------------------------------


@dataclass
class _Plan:
    """What the import would change, and what it found wrong, before anything is written."""

    refs: list[RefChange] = field(default_factory=list)
    heads: list[FileChange] = field(default_factory=list)
    indexes: list[IndexChange] = field(default_factory=list)
    files: list[FileChange] = field(default_factory=list)
    carrier: dict[str, str] = field(default_factory=dict)  # keep-ref suffix -> object id
    conflicts: list[GitRefConflict] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    old_heads: dict[str, str | None] = field(default_factory=dict)


def _split(rel: str) -> tuple[str, str]:
    parts = rel.split("/")
    if parts[0] == "worktrees" and len(parts) >= 3:
        return f"worktrees/{parts[1]}", "/".join(parts[2:])
    return "", rel


class _Importer:
    def __init__(self, snap: Snapshot, scan: UpperScan, work: str, hexlen: int) -> None:
        self.snap = snap
        self.gitdir = snap.gitdir
        self.upper = snap.upper
        self.scan = scan
        self.work = work
        self.view = os.path.join(work, "view.git")
        self.hexlen = hexlen
        self.object_format = "sha256" if hexlen == 64 else "sha1"
        self.plan = _Plan()
        self.result = ImportResult()
        self._n = 0
        self.reflogs: list[tuple[str, str]] = []  # (admin, `logs/<ref>`)
        # What the plan writes over a host reflog (`[worktrees/<name>/]logs/<ref>`; None: removed).
        self.reflog_writes: dict[str, bytes | None] = {}
        self.host_logs: dict[str, bytes | None] = {}  # the host's copy of each, as read then
        self.index_blobs: dict[str, list[str]] = {}  # admin -> blobs its new index names
        self.view_refs: dict[str, str] = {}  # the command's refs, as git read them
        self.within: dict[str, bool] = {}  # admin -> whether its worktree lies in the roots
        # Refs the host moved meanwhile that the command changed too -> the host's value:
        # a fast-forward when git finds it an ancestor of the command's (`settle`).
        self.fast_forwards: dict[str, str] = {}
        self.forwarded: set[str] = set()  # those git found to be fast-forwards
        self.index_on: dict[str, str] = {}  # admin -> that ref its changed index rides on
        self.kept_heads: set[str] | None = None  # `_checked_out_kept`, read once
        self.outside_heads: dict[str, str] | None = None  # `_checked_out_outside`, the same
        self.view_admins: dict[str, str] = {}  # admin -> its git dir in the view
        self.kept_deleted: set[str] = set()  # refs the command deleted that stay, reflog too

    def _stash(self, data: bytes) -> str:
        """A checked copy in the work dir (what the transaction writes, and a recovery)."""
        self._n += 1
        path = os.path.join(self.work, "files", str(self._n))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return path

    def _read(self, rel: str, limit: int = sf.MAX_TEXT) -> bytes:
        data = read_regular(os.path.join(self.upper, rel), limit + 1)
        if len(data) > limit:
            raise sf.StateRefused(f"{rel} is larger than {limit} bytes")
        return data

    # -- classification of the command's writes ---------------------------------------

    def classify(self) -> tuple[set[str], set[str], dict[str, set[str]], set[str]]:
        """(admins whose HEAD changed, admins whose index changed, state dirs touched per
        admin, loose files touched as `admin\\0name`)."""
        heads: set[str] = set()
        indexes: set[str] = set()
        dirs: dict[str, set[str]] = {}
        loose: set[str] = set()
        entries = [(r, "file") for r in self.scan.files]
        entries += [(r, "gone") for r in self.scan.whiteouts]
        entries += [(r, "odd") for r in self.scan.odd]
        entries += [(r, "opaque") for r in self.scan.opaque]
        for rel, kind in entries:
            admin, sub = _split(rel)
            top = sub.split("/")[0]
            if rel.startswith("modules/") or rel == "modules":
                continue  # submodules' git directories: imported each on its own
            if admin and sub in _WORKTREE_LINKS:
                if kind == "file":
                    loose.add(f"{admin}\0{sub}")
                continue
            if rel == "worktrees" or (admin == "" and top == "worktrees"):
                if kind == "gone" and rel.count("/") == 1:
                    self._remove_admin(rel)
                elif rel == "worktrees" and kind in ("gone", "opaque"):
                    # The last linked worktree removed: git removes `worktrees/` with it
                    # (opaque: made again since). Each host admin the command no longer has.
                    for gone in _admins(self.gitdir)[1:]:
                        if not any(r.startswith(gone + "/") for r in self.scan.files):
                            self._remove_admin(gone)
                continue
            if top == "logs":
                if kind in ("file", "gone"):
                    self.reflogs.append((admin, sub))
                continue
            if top in ("objects", "refs", "packed-refs") and not admin:
                if rel in ("objects/info/alternates", "objects/info/http-alternates"):
                    self.result.denials.append((rel, "alternates"))
                continue
            if admin and top == "refs":
                continue  # per-worktree refs (bisect, rewritten): not imported
            if sub == "HEAD":
                heads.add(admin) if kind == "file" else None
            elif sub == "index":
                indexes.add(admin) if kind == "file" else None
            elif top in sf.STATE_DIRS:
                dirs.setdefault(admin, set()).add(top)
            elif sub in sf.PSEUDO_REFS or sub in sf.MESSAGES:
                if kind in ("file", "gone"):
                    loose.add(f"{admin}\0{sub}")
            elif sub in sf.IGNORED or sub.endswith(".lock") or kind == "opaque":
                continue
            elif top in _CONTROL:
                if kind != "gone":
                    self.result.denials.append((rel, top))
            elif kind != "gone":
                self.result.denials.append((rel, f"{top} is not git state"))
        return heads, indexes, dirs, loose

    def _remove_admin(self, admin: str) -> None:
        if not self._within_roots(admin):
            # Its checkout would be left without a repository (`git worktree prune` or
            # `remove` of one the command cannot even see).
            why = "a worktree outside the writable roots stays registered"
            self.result.denials.append((admin, why))
            return
        if self._checkout_still_linked(admin):
            # Its `.git` file was held for the command (`git_spawn._dotgit_link`): `git
            # worktree remove` deleted the files, failed on it, and went on to the admin
            # dir; removed, it would leave the host a checkout with no repository.
            why = "its checkout's .git file is still there: remove the worktree on the host"
            self.result.denials.append((admin, why))
            return
        self.plan.files.append(self._change("", admin, None))

    def _checkout_still_linked(self, admin: str) -> bool:
        """Whether the host's linked worktree of ``admin`` still has the `.git` file that
        leads back to it (as `gitdir` names it now)."""
        host = self._host_gitdir(admin)
        dotgit = sf.canonical_gitdir(host) if host is not None else None
        if dotgit is None or os.path.islink(dotgit):
            return False
        return read_gitfile(dotgit) == os.path.realpath(os.path.join(self.gitdir, admin))

    def _change(
        self, admin: str, rel: str, source: str | None, keeps: list[str] | None = None
    ) -> FileChange:
        """A FileChange with the digest of the host's copy now, as the plan sees it (the
        transaction writes only over that, `transaction._apply_file`), and of ``source``."""
        before = path_digest(os.path.join(self.gitdir, admin, rel))
        after = ABSENT if source is None else path_digest(source)
        return FileChange(admin, rel, source, before=before, after=after, keeps=keeps or [])

    # -- refs ----------------------------------------------------------------------------

    def plan_refs(self, host_now: dict[str, str]) -> None:
        view_refs = self.view_refs = host_refs(self.view)
        start = self.snap.refs or {}
        names = sorted(set(start) | set(view_refs))
        loose = frozenset(self.snap.loose or ())
        for name in names:
            if name.startswith((KEEP_NAMESPACE + "/", _CARRIER + "/")):
                continue
            s, c, h = start.get(name), view_refs.get(name), host_now.get(name)
            if c in (s, h):
                continue  # unchanged, or the host's own change the command saw
            if name in loose and name not in self.scan.files and not self.scan.removed(name):
                # Loose when the command started, and the command wrote nothing there: a
                # host `git pack-refs` (or `gc`) removed the file meanwhile, and the view
                # showed the value in the command's stale copy of `packed-refs` (a deleted
                # tag copies it up): the host's branch was rewound (a red team's).
                continue
            if name.startswith("refs/replace/"):
                # Host git would show the replacement wherever the object appears (a diff
                # of a file the command never touched), while a push sends the original.
                self.result.denials.append((name, "a replace ref: what host git shows"))
                continue
            if c is None:
                broken = git(self.view, "rev-parse", "-q", "--verify", name, check=False)
                if broken.returncode == 0:
                    self.plan.refused.append(f"{name}: names an object that does not exist")
                    continue
            outside = self._checked_out_outside()
            if c is None and self._refs_removed_whole():
                # `rm -rf .git` (its config and hooks stay, protected): every branch and tag
                # went with the directory, not one by one as git deletes a ref. Kept, as the
                # checked-out branch is: the host's history is not the command's to drop.
                self.result.denials.append((name, "removed with the whole refs directory"))
                self.kept_deleted.add(name)
                continue
            if c is None and name not in outside and name in self._checked_out_kept():
                # As git refuses to delete a checked-out branch: the checkout would be left
                # with no commits and the branch's commits with no ref (an `rm -rf` of a
                # repository, whose protected config and hooks stay, deleted every ref).
                self.result.denials.append(
                    (name, "checked out: its checkout would have no commits")
                )
                self.kept_deleted.add(name)
                continue
            misnamed = self._misnamed(name) if c is not None else None
            if misnamed is not None:
                # Kept as a ref held outside is (a conflict under the keep namespace).
                self.result.denials.append((name, misnamed))
                self.plan.conflicts.append(GitRefConflict(name=name, host=h, command=c))
            elif name in outside:
                # That checkout's `git status`, `checkout .` and `reset --hard` would then
                # write the command's tree outside every root: the ref stays the host's.
                where = outside[name] or "the main worktree"
                why = f"checked out in {where}, a worktree outside the writable roots"
                self.result.denials.append((name, why))
                self.plan.conflicts.append(GitRefConflict(name=name, host=h, command=c))
            elif h != s and h is not None and c is not None and name.startswith(_FAST_FORWARD):
                self.fast_forwards[name] = h  # decided once the command's objects are the host's
            elif h != s:
                self.plan.conflicts.append(GitRefConflict(name=name, host=h, command=c))
            self.plan.refs.append(RefChange(name, c, s))
            if c is not None:
                self.plan.carrier[name.removeprefix("refs/")] = c

    def _misnamed(self, name: str) -> str | None:
        """Why host git must not get ref ``name`` (None: it may): a branch name git's own
        `check-ref-format --branch` refuses (`HEAD`, `-x`), or any ref git's rev-parse
        rules read as `HEAD` or a pseudo ref (`refs/tags/HEAD`): every host command would
        warn that the name is ambiguous, or resolve it to the command's commit."""
        if name in _SHADOWING:
            return "shadows a name git resolves itself (HEAD, ORIG_HEAD, ...): ambiguous"
        branch = name.removeprefix("refs/heads/")
        if branch != name:
            done = git(self.view, "check-ref-format", "--branch", branch, check=False)
            if done.returncode != 0:
                return "not a branch name git accepts (`git check-ref-format --branch`)"
        return None

    def _view_admin(self, admin: str) -> str:
        """The view's git dir for ``admin``, whose HEAD is the command's (made once)."""
        if not admin:
            return self.view
        if admin not in self.view_admins:
            head = os.path.join(self.upper, admin, "HEAD")
            self.view_admins[admin] = add_admin_head(self.view, admin, head)
        return self.view_admins[admin]

    def plan_head(self, admin: str) -> None:
        view_admin = self._view_admin(admin)
        sym = git(view_admin, "symbolic-ref", "-q", "HEAD", check=False)
        if sym.returncode == 0:
            target = sym.stdout.decode(errors="replace").strip()
            ok = target.startswith("refs/heads/") and (
                target in self.view_refs  # a name git itself listed
                or git(view_admin, "check-ref-format", target, check=False).returncode == 0
            )
            if not ok:
                self.plan.refused.append(f"{admin or '.'}/HEAD: not a branch ({target!r})")
                return
            if target not in self.view_refs and self._refs_removed_whole():
                # `rm -rf .git && git init`: the host's branches stay, so does its checkout.
                why = "names a branch that does not exist, its refs removed whole"
                self.result.denials.append((os.path.join(admin, "HEAD"), why))
                return
            new = f"ref: {target}\n"
        else:
            oid = git(view_admin, "rev-parse", "-q", "--verify", "HEAD", check=False)
            if oid.returncode != 0:
                self.plan.refused.append(f"{admin or '.'}/HEAD: neither a branch nor an object")
                return
            value = oid.stdout.decode(errors="replace").strip()
            new = f"{value}\n"
            self.plan.carrier[os.path.join(admin, "HEAD")] = value
        old = self.snap.heads.get(admin)
        if new == old:
            return
        now = _read_head(self.gitdir, admin)
        if now != old:
            self.plan.conflicts.append(
                GitRefConflict(name=os.path.join(admin, "HEAD"), host=now, command=new)
            )
        self.plan.old_heads[admin] = old
        keeps = [self._keep(os.path.join(admin, "HEAD"))] if _detached(new) else []
        self.plan.heads.append(FileChange(admin, "HEAD", self._stash(new.encode()), keeps=keeps))

    def _keep(self, suffix: str) -> str:
        """The keep-ref a carrier suffix becomes on the host (`_fetch`)."""
        return f"{KEEP_NAMESPACE}/{self.snap.run_id}/{suffix}"

    # -- the index -----------------------------------------------------------------------

    def _ls_files(self, index: str, *, tags: bool = False) -> bytes:
        """The entries of ``index`` as git's reader sees them (`-v`: with a status tag, `S`
        for skip-worktree, lower-case where the assume-unchanged bit is set)."""
        env = git_env(GIT_INDEX_FILE=index)
        args = ["ls-files", "--stage", "-z", *(["-v"] if tags else [])]
        return git(self.view, *args, env=env).stdout

    def _mark(self, env: dict[str, str], flag: str, paths: list[bytes]) -> str | None:
        """Set ``flag`` on ``paths`` of the index ``env`` names; why git refused, or None."""
        empty = os.path.join(self.work, "empty-worktree")
        os.makedirs(empty, exist_ok=True)
        done = git(
            self.view,
            f"--work-tree={empty}",
            "update-index",
            "-z",
            flag,
            "--stdin",
            input=b"".join(p + b"\0" for p in paths),
            env=env,
            check=False,
        )
        return done.stderr.decode(errors="replace").strip()[:200] if done.returncode else None

    def _hiding_bits(
        self, admin: str, host_listed: bytes, sparse: list[bytes], assumed: list[bytes]
    ) -> tuple[list[bytes], list[bytes]]:
        """The skip-worktree and assume-unchanged bits kept: those the host's index has, and
        new skip-worktree bits where the host checks out sparsely. A bit the command set
        anew hides its edit of that file from the host's `git status`, `diff` and `commit
        -a` (a red team's: a build script changed, and no review through git saw it)."""
        host = [e for e in host_listed.split(b"\0") if e]
        had_sparse = {e.split(b"\t", 1)[1] for e in host if e[:2] in (b"S ", b"s ")}
        had_assumed = {e.split(b"\t", 1)[1] for e in host if e[:1].islower()}
        admin_dir = os.path.join(self.gitdir, admin) if admin else self.gitdir
        if [p for p in sparse if p not in had_sparse]:
            done = git(admin_dir, "config", "--bool", "core.sparseCheckout", check=False)
            if done.stdout.strip() == b"true":
                had_sparse.update(sparse)
        dropped = sorted(
            {*(p for p in sparse if p not in had_sparse)}
            | {p for p in assumed if p not in had_assumed}
        )
        if dropped:
            shown = ", ".join(p.decode(errors="replace") for p in dropped[:5])
            self.result.denials.append(
                (
                    f"{admin or '.'}/index",
                    f"skip-worktree or assume-unchanged bits the command set ({shown}): they "
                    "hide its edits from host git; the entries are kept without them",
                )
            )
        kept_sparse = [p for p in sparse if p in had_sparse]
        return kept_sparse, [p for p in assumed if p in had_assumed]

    def _index_changed(self, admin: str) -> bool:
        """Whether the host's index of ``admin`` changed since the command started: replaced,
        and not only its stat data refreshed (the same entries, flags and intents as the
        copy `begin` kept: a host `git status`, an IDE's poll)."""
        index = os.path.join(self.gitdir, admin, "index")
        if _identity(index) == self.snap.indexes.get(admin):
            return False
        start = self.snap.start_indexes.get(admin)
        if not start or not os.path.isfile(start) or not os.path.isfile(index):
            return True
        try:
            same = self._ls_files(start, tags=True) == self._ls_files(index, tags=True)
            return not (same and self._intent_to_add(start) == self._intent_to_add(index))
        except GitError:
            return True

    def _intent_to_add(self, index: str) -> set[bytes]:
        """Paths `git add -N` put in ``index`` (git's own `--debug` listing, flag bit 29)."""
        out = git(self.view, "ls-files", "-s", "-z", "--debug", env=git_env(GIT_INDEX_FILE=index))
        found: set[bytes] = set()
        for match in _DEBUG_ENTRY.finditer(out.stdout):
            if int(match.group(2), 16) & _INTENT_TO_ADD:
                found.add(match.group(1).split(b"\t", 1)[1])
        return found

    def _add_intents(self, paths: list[bytes], env: dict[str, str]) -> None:
        """Intent-to-add entries, made by `git add -N` over an empty work tree of ours
        (the paths passed git's path rules when the rest of the index was rebuilt)."""
        tree = os.path.realpath(os.path.join(self.work, "intent-worktree"))
        for path in paths:
            full = os.path.realpath(os.path.join(tree, os.fsdecode(path)))
            if not full.startswith(tree + "/"):
                continue
            os.makedirs(os.path.dirname(full), exist_ok=True)
            open(full, "ab").close()  # an empty file, closed at once
        git(
            self.view,
            f"--work-tree={tree}",
            "add",
            "-N",
            "--pathspec-from-file=-",
            "--pathspec-file-nul",
            input=b"".join(p + b"\0" for p in paths),
            env=env,
            check=False,
        )

    def plan_index(self, admin: str) -> None:
        src = os.path.join(self.upper, admin, "index")
        try:
            tagged = self._ls_files(src, tags=True)
        except GitError as exc:
            self.plan.refused.append(f"{admin or '.'}/index: git cannot read it ({exc.stderr})")
            return
        host_index = os.path.join(self.gitdir, admin, "index")
        host_listed = b""
        if os.path.isfile(host_index):
            with contextlib.suppress(GitError):
                host_listed = self._ls_files(host_index, tags=True)
        if tagged == host_listed:
            return  # the same entries (a refresh): the host's index stays as it is
        rebuilt = os.path.join(self.work, f"index-{len(self.plan.indexes)}")
        env = git_env(GIT_INDEX_FILE=rebuilt)
        entries = [e[2:] for e in tagged.split(b"\0") if e]
        sparse = [e.split(b"\t", 1)[1] for e in tagged.split(b"\0") if e[:2] in (b"S ", b"s ")]
        # The assume-unchanged bits (a local edit the user hides from `git commit -a`): the
        # rebuild dropped them, and the user's next `commit -a` took the hidden edit (a red
        # team's: a local token committed).
        assumed = [e.split(b"\t", 1)[1] for e in tagged.split(b"\0") if e[:1].islower()]
        sparse, assumed = self._hiding_bits(admin, host_listed, sparse, assumed)
        intents = self._intent_to_add(src)
        listed = b"".join(e + b"\0" for e in entries if e.split(b"\t", 1)[1] not in intents)
        done = git(self.view, "update-index", "-z", "--index-info", input=listed, env=env)
        if intents and os.path.exists(rebuilt):
            self._add_intents(sorted(intents), env)
        # Sparse checkout's skip-worktree bits and the assume-unchanged ones, set by git on
        # the rebuilt entries; refused where git cannot (a crafted index: `a` beside `a/b`
        # whose `a` the rebuild dropped), never an import that fails and keeps its layer.
        for flag, paths in (("--skip-worktree", sparse), ("--assume-unchanged", assumed)):
            why = self._mark(env, flag, paths) if paths and os.path.exists(rebuilt) else None
            if why is not None:
                self.plan.refused.append(f"{admin or '.'}/index: git refuses its entries ({why})")
                return
        kept = [e for e in self._ls_files(rebuilt).split(b"\0") if e]
        if len(kept) != len(entries) or not os.path.exists(rebuilt):
            ignored = [
                line.removeprefix("Ignoring path ")
                for line in done.stderr.decode(errors="replace").splitlines()
            ]
            self.plan.refused.append(
                f"{admin or '.'}/index: paths git refuses ({', '.join(ignored[:5])})"
            )
            return
        head_now = _read_head(self.gitdir, admin)
        if head_now != self.snap.heads.get(admin):
            # The index is relative to the HEAD the command saw: the host switched away.
            self.plan.conflicts.append(
                GitRefConflict(name=os.path.join(admin, "HEAD"), host=head_now, command="index")
            )
        branch = _branch(head_now)
        if (
            head_now == self.snap.heads.get(admin)
            and branch is not None
            and branch in self.fast_forwards
            and admin not in {h.admin for h in self.plan.heads}
        ):
            # Staged on a tip the host moved forward (another import, say): taken only if
            # the host's index is that tip's tree (`settle`, then under git's index lock).
            self.index_on[admin] = branch
        elif self._index_changed(admin):
            self.plan.conflicts.append(
                GitRefConflict(name=os.path.join(admin, "index"), host="changed", command="changed")
            )
        blobs: dict[str, None] = {}
        host_links = {e.split(b"\t", 1)[1] for e in host_listed.split(b"\0") if e[2:8] == b"160000"}
        for entry in kept:
            meta, _, path = entry.partition(b"\t")
            mode, oid, _stage = meta.decode().split(" ")
            if mode == _GITLINK:
                if path not in host_links:
                    self.result.new_gitlinks.append(path.decode(errors="replace"))
            else:
                blobs[oid] = None
        self.index_blobs[admin] = list(blobs)
        tmp_name = f".bash-sandbox-{self.snap.run_id}-index"
        self.plan.indexes.append(IndexChange(admin, rebuilt, tmp_name))

    # -- pseudo-refs, messages, state directories ---------------------------------------

    def plan_loose(self, admin: str, name: str) -> None:
        rel = os.path.join(admin, name)
        if rel in self.scan.whiteouts:
            self.plan.files.append(self._change(admin, name, None))
            return
        keeps: list[str] = []
        try:
            data = self._read(rel)
            if name in sf.PSEUDO_REFS:
                oids = sf.parse_oids(data, self.hexlen)
                for i, oid in enumerate(oids):
                    self.plan.carrier[os.path.join(admin, f"{name}-{i}")] = oid
                    keeps.append(self._keep(os.path.join(admin, f"{name}-{i}")))
                data = "".join(f"{o}\n" for o in oids).encode()
            elif name == "gitdir":
                host = self._host_gitdir(admin)
                if host == data:
                    return  # rewritten as it was (`git worktree repair`)
                if host is not None and not sf.worktree_inside(host, self.snap.roots):
                    # Its checkout outside stays where it is: re-pointed into a root it
                    # would count as inside (its branch moved, its index written), or
                    # at nothing, and `git worktree prune` would drop its repository.
                    why = "a worktree outside the writable roots keeps its gitdir"
                    self.result.denials.append((rel, why))
                    return
                path = sf.canonical_gitdir(data)
                if path is None:
                    raise sf.StateRefused("not an absolute path that is its own realpath")
                if not within_any(path, tuple(self.snap.roots)):
                    # Host git writes there (`git worktree repair` makes its `.git` file)
                    # and `git worktree remove --force` deletes it.
                    raise sf.StateRefused("a worktree outside the writable roots")
                data = os.fsencode(path) + b"\n"
            elif name == "commondir":
                if data.strip() != b"../..":
                    raise sf.StateRefused("a common dir other than git's own")
            elif name == "BISECT_START":
                data = sf.check_bisect_start(data)
            else:
                data = sf.check_text(data)
        except (sf.StateRefused, UnicodeError) as exc:
            self.plan.refused.append(f"{rel}: {exc}")
            return
        self.plan.files.append(self._change(admin, name, self._stash(data), keeps))

    def _host_gitdir(self, admin: str) -> bytes | None:
        """The host's `gitdir` of a linked worktree's admin dir now (None: it has none)."""
        try:
            return read_regular(os.path.join(self.gitdir, admin, "gitdir"), sf.MAX_TEXT)
        except OSError:
            return None

    def plan_state_dir(self, admin: str, top: str) -> None:
        rel_dir = os.path.join(admin, top)
        merged: dict[str, str] = {}
        host_dir = os.path.join(self.gitdir, rel_dir)
        before = path_digest(host_dir)  # before reading it: a change after is not written over
        if not self.scan.removed(rel_dir):
            with contextlib.suppress(OSError):
                for entry in os.scandir(host_dir):
                    rel = f"{rel_dir}/{entry.name}"
                    if entry.is_file(follow_symlinks=False) and not self.scan.removed(rel):
                        merged[entry.name] = entry.path
        for rel in self.scan.files:
            if rel.startswith(rel_dir + "/") and "/" not in rel[len(rel_dir) + 1 :]:
                merged[rel[len(rel_dir) + 1 :]] = os.path.join(self.upper, rel)
        if not merged:
            self.plan.files.append(FileChange(admin, top, None, before=before, after=ABSENT))
            return
        out = os.path.join(self.work, "dirs", str(len(self.plan.files)), top)
        os.makedirs(out)
        try:
            for name, path in sorted(merged.items()):
                data = read_regular(path, sf.MAX_TEXT + 1)
                checked = sf.check_state_file(f"{top}/{name}", path, data)
                self._no_branch_outside(f"{top}/{name}", checked.data)
                with open(os.path.join(out, name), "wb") as fh:
                    fh.write(checked.data)
        except (sf.StateRefused, OSError) as exc:
            self.plan.refused.append(f"{rel_dir}/: {exc}")
            return
        after = path_digest(out)
        self.plan.files.append(FileChange(admin, top, out, True, before=before, after=after))

    def _no_branch_outside(self, rel: str, data: bytes) -> None:
        """Refuse a rebase's state that names a branch checked out in a worktree outside the
        roots: the host's `git rebase --abort` (`head-name`) or `--continue`
        (`update-refs`) moves it there without git's own check, and that checkout's next
        `reset --hard` writes the command's tree outside every root (a red team's)."""
        if rel not in sf.BRANCH_FILES:
            return
        outside = self._checked_out_outside()
        for branch in sf.named_branches(rel, data):
            if branch in outside:
                where = outside[branch] or "the main worktree"
                raise sf.StateRefused(
                    f"{rel} names {branch}, checked out in {where}, outside the writable roots"
                )

    def plan_reflog(self, admin: str, sub: str, missing: set[str], absent: frozenset[str]) -> None:
        """A reflog the command changed (a stash pushed or dropped, a commit): each entry
        parsed and written back, the objects it names imported (a stash lives only there)."""
        rel = os.path.join(admin, sub)
        name = sub.removeprefix("logs/")
        head, _, base = rel.rpartition("/")
        known = self.view_refs.keys() | (self.snap.refs or {}).keys()
        if name != "HEAD" and name not in known:  # only the reflog of a ref git listed
            self.result.denials.append((rel, "not the reflog of a ref"))
            return
        try:
            host_mtime = os.lstat(os.path.join(self.gitdir, rel)).st_mtime_ns
        except OSError:
            host_mtime = 0
        # Read once: what the keep-refs are judged on is what the transaction writes over.
        host = self.host_logs[rel] = self._host_log_bytes(rel)
        before = ABSENT if host is None else content_digest(host, reflog_of=self.snap.run_id)
        if rel in self.scan.whiteouts:
            self.reflog_writes[rel] = None
            self.plan.files.append(
                FileChange(head, base, None, before=before, after=ABSENT, reflog=True)
            )
            return
        try:
            mine = self._read(rel)
            if host is not None and self.snap.taken_ns and host_mtime > self.snap.taken_ns:
                # Both wrote it (the host's `git checkout`, `commit`, `reset` meanwhile): the
                # host's entries stay, the command's new ones after them. Replacing it lost
                # the user's way back to a detached commit (a red team's).
                mine = _merged_reflog(host, mine)
            data, oids = sf.parse_reflog(mine, self.hexlen, absent)
        except (sf.StateRefused, OSError) as exc:
            self.plan.refused.append(f"{rel}: {exc}")
            return
        keeps = []
        for i, oid in enumerate(o for o in oids if o in missing):
            suffix = f"logs/{admin}/{name}/{i}".replace("//", "/")
            self.plan.carrier[suffix] = oid
            keeps.append(self._keep(suffix))
        self.reflog_writes[rel] = data
        after = content_digest(data, reflog_of=self.snap.run_id)
        self.plan.files.append(
            FileChange(
                head, base, self._stash(data), before=before, after=after, reflog=True, keeps=keeps
            )
        )

    def plan_kept(self, host_now: dict[str, str]) -> None:
        """Keep-refs, moved in the same transaction as the rest, for each commit the host
        reached through a ref, a HEAD or a reflog that the import would leave unreachable:
        entries the command removed from a reflog (`git reflog expire`, `git stash drop`),
        a ref it deleted (git deletes its reflog with it), a worktree it removed. So the
        host's `git gc` never loses one of its commits through the import."""
        deleted = {f"logs/{c.name}" for c in self.plan.refs if c.new is None}
        removed = {
            f.rel for f in self.plan.files if not f.source and f.rel.startswith("worktrees/")
        }
        gone = {c.old or "" for c in self.plan.refs}
        gone |= {_detached(self.plan.old_heads.get(h.admin)) for h in self.plan.heads}
        for admin in removed:
            gone |= self._host_reflog(os.path.join(admin, "logs", "HEAD"))
            gone.add(_detached(_read_head(self.gitdir, admin)))
        after: set[str] = set()  # named by a reflog the import leaves: reachable through it
        for rel in {*self.reflog_writes, *(f"logs/{c.name}" for c in self.plan.refs)}:
            if rel in self.reflog_writes:
                self._reflog_kept(rel, gone, after)
            elif rel in deleted:
                gone |= self._host_reflog(rel)
            else:
                after |= self._host_reflog(rel)  # git appends to a reflog it keeps
        gone -= {*after, "", "0" * self.hexlen}
        if not gone:
            return
        refs = {**host_now, **{c.name: c.new or "" for c in self.plan.refs}}
        heads = {a: _read_head(self.gitdir, a) for a in _admins(self.gitdir) if a not in removed}
        for change in self.plan.heads:
            assert change.source is not None
            with open(change.source, "rb") as fh:
                heads[change.admin] = fh.read().decode(errors="replace")
        for admin in heads:
            if os.path.join(admin, "logs", "HEAD") not in self.reflog_writes:
                after |= self._host_reflog(os.path.join(admin, "logs", "HEAD"))
        stays = {*refs.values(), *map(_detached, heads.values()), *after} - {""}
        # Git's walk from the lost ids, stopped at all that stays (tags peeled; trees, blobs
        # and ids the host lacks skipped): the tips of what it finds are kept.
        walk = git(
            self.gitdir,
            "rev-list",
            "--parents",
            "--ignore-missing",
            "--stdin",
            input="".join(
                [*(f"{o}\n" for o in sorted(gone)), *(f"^{o}\n" for o in stays)]
            ).encode(),
        )
        lost: dict[str, None] = {}
        parents: set[str] = set()
        for line in walk.stdout.decode().splitlines():
            commit, *above = line.split()
            lost[commit] = None
            parents.update(above)
        prefix = f"{KEEP_NAMESPACE}/{self.snap.run_id}-kept"
        for i, oid in enumerate(o for o in lost if o not in parents):
            self.plan.refs.append(RefChange(f"{prefix}/{i}", oid, None))

    def _reflog_kept(self, rel: str, gone: set[str], after: set[str]) -> None:
        """Entries, not ids: `git gc` expires a reflog entry by its date, so a host entry the
        command's copy does not keep as it was is removed (its ids `gone`), and an entry of
        the command's keeps its ids (`after`) only as the host's own line or as a new entry
        no older than the command (a clock's slack allowed). (An entry `git reflog delete
        --rewrite` rewrote names its new id as the next entry's old one, or is the tip.)"""
        host = sf.reflog_entries(self.host_logs.get(rel) or b"", self.hexlen)
        final = sf.reflog_entries(self.reflog_writes[rel] or b"", self.hexlen)
        host_lines = {e.line for e in host}
        final_lines = {e.line for e in final}
        since = ((self.snap.taken_ns or time.time_ns()) - _CLOCK_SLACK_NS) // 1_000_000_000
        for entry in host:
            if entry.line not in final_lines:
                gone.update(entry.oids)
        for entry in final:
            if entry.line in host_lines or (entry.time is not None and entry.time >= since):
                after.update(entry.oids)

    def _host_log_bytes(self, rel: str) -> bytes | None:
        try:
            return read_regular(os.path.join(self.gitdir, rel), 8 * sf.MAX_TEXT)
        except OSError:
            return None

    def _host_reflog(self, rel: str) -> set[str]:
        data = self.host_logs[rel] if rel in self.host_logs else self._host_log_bytes(rel)
        return sf.reflog_oids(data or b"", self.hexlen)

    def _missing(self) -> tuple[set[str], frozenset[str]]:
        """The objects the reflogs name that the host lacks (imported, with keep-refs), and
        those nobody has (their entries are dropped: git prunes them the same way)."""
        wanted: dict[str, None] = {}
        for admin, sub in self.reflogs:
            rel = os.path.join(admin, sub)
            if rel in self.scan.files:
                with contextlib.suppress(sf.StateRefused, OSError):
                    wanted.update(dict.fromkeys(sf.parse_reflog(self._read(rel), self.hexlen)[1]))
        missing = self._host_lacks(wanted)
        absent = self._absent(self.view, missing) if missing else set()
        return missing - absent, frozenset(absent)

    def _host_lacks(self, oids: Iterable[str]) -> set[str]:
        """Of ``oids``, those the host's store lacks, asked through a repository of the
        executor's whose only objects are the host's (`view.host_objects`: a partial
        clone's own config would have git fetch them, or fail with lazy fetching off)."""
        store = host_objects(
            os.path.join(self.work, "host.git"), self.gitdir, object_format=self.object_format
        )
        return self._absent(store, oids)

    @staticmethod
    def _absent(gitdir: str, oids: Iterable[str]) -> set[str]:
        done = git(
            gitdir,
            "cat-file",
            "--batch-check=%(objectname)",
            input="".join(f"{o}\n" for o in oids).encode(),
        )
        return {line.split()[0] for line in done.stdout.decode().splitlines() if "missing" in line}

    # -- the whole ------------------------------------------------------------------------

    def run(self, *, keep_only: bool) -> ImportResult:
        heads, indexes, dirs, loose = self.classify()
        # A worktree outside the roots, linked or the main one (the workspace a linked
        # worktree of a checkout elsewhere): its HEAD, index, state and HEAD reflog stay the
        # host's (the user's `git restore`, `checkout`, `merge --abort` or `checkout -`
        # there would write what the command planted, outside every root; a red team
        # staged an executable there).
        state = {k for k in loose if k.split("\0")[1] not in _WORKTREE_LINKS}
        # A worktree's own reflogs: all of a linked one's admin dir, the main one's `HEAD`.
        own_logs = {(a, sub) for a, sub in self.reflogs if a or sub == "logs/HEAD"}
        touched = {*heads, *indexes, *dirs, *(k.split("\0")[0] for k in state)}
        for admin in sorted(touched | {a for a, _ in own_logs}):
            if not self._within_roots(admin):
                why = (
                    f"{admin or '.'}: a worktree outside the writable roots; its HEAD, index, "
                    "state and HEAD reflog stay the host's"
                )
                if admin in touched:
                    self.plan.refused.append(why)
                else:
                    # Its reflog alone (`git gc --auto` rewrites them all): the write is
                    # dropped, the rest of the import goes on.
                    self.result.denials.append((os.path.join(admin, "logs"), why))
                heads.discard(admin)
                indexes.discard(admin)
                dirs.pop(admin, None)
                loose -= {k for k in state if k.split("\0")[0] == admin}
                self.reflogs = [r for r in self.reflogs if r[0] != admin or r not in own_logs]
        for rel in self.scan.refused:
            self.plan.refused.append(rel)
        host_now = host_refs(self.gitdir)
        self.plan_refs(host_now)
        kept_logs = {f"logs/{name}" for name in self.kept_deleted}
        self.reflogs = [r for r in self.reflogs if r[0] or r[1] not in kept_logs]
        for admin in sorted(heads):
            self.plan_head(admin)
        for admin in sorted(indexes):
            self.plan_index(admin)
        for admin, tops in sorted(dirs.items()):
            for top in sorted(tops):
                self.plan_state_dir(admin, top)
        # A new linked worktree's `gitdir` last: git takes the directory as a worktree then.
        order = {"gitdir": 2, "commondir": 1}
        missing, absent = self._missing()
        for admin, sub in sorted(self.reflogs):
            self.plan_reflog(admin, sub, missing, absent)
        for key in sorted(loose, key=lambda k: (order.get(k.split("\0")[1], 0), k)):
            admin, name = key.split("\0")
            self.plan_loose(admin, name)
        plan = self.plan
        if not (plan.refs or plan.heads or plan.indexes or plan.files or plan.refused):
            return self.result
        keep_prefix = f"{KEEP_NAMESPACE}/{self.snap.run_id}"
        keep_refs = self._transfer(keep_prefix)
        if keep_refs is None:
            self.result.unimported = True
            return self.result
        crash_point("objects")
        kept = keep_prefix if keep_refs else None
        if keep_only:
            return self.result
        self.settle()
        if plan.refused:
            return self._outcome(GitImportStatus.REFUSED, kept=kept)
        if plan.conflicts:
            return self._outcome(GitImportStatus.CONFLICT, kept=kept)
        self.plan_kept(host_now)
        journal = Journal(
            gitdir=self.gitdir,
            run_id=self.snap.run_id,
            keep_prefix=keep_prefix,
            keep_refs=keep_refs,
            refs=plan.refs,
            heads=plan.heads,
            indexes=plan.indexes,
            files=plan.files,
            old_heads=plan.old_heads,
        )
        journal_path = os.path.join(self.work, JOURNAL)
        journal.save(journal_path)
        crash_point("journal")
        try:
            check_head_locks(journal)
            take_index_locks(journal)
            self._unchanged_under_lock(journal)
        except Conflict as exc:
            release_index_locks(self.gitdir, journal.indexes)
            os.unlink(journal_path)
            plan.conflicts.append(GitRefConflict(name=exc.name, host=exc.host, command=exc.command))
            return self._outcome(GitImportStatus.CONFLICT, kept=kept)
        try:
            applied = apply(journal, journal_path, "0" * self.hexlen)
        except Conflict as exc:
            os.unlink(journal_path)
            plan.conflicts.append(GitRefConflict(name=exc.name, host=exc.host, command=exc.command))
            return self._outcome(GitImportStatus.CONFLICT, kept=kept)
        except BaseException:
            release_index_locks(self.gitdir, journal.indexes) if not journal.committed else None
            raise
        os.unlink(journal_path)
        # After the refs moved, the host's git took `HEAD.lock` (or an index lock was
        # lost), or wrote a state file or reflog itself: what is missing is named, the rest
        # stays applied, and so do the keep-refs of what was not written.
        wanted = [os.path.join(h.admin, "HEAD") for h in plan.heads]
        wanted += [os.path.join(i.admin, "index") for i in plan.indexes]
        lost = [w for w in wanted if w not in applied]
        plan.refused += [f"{w}: the host's git held or moved it; kept as it was" for w in lost]
        skipped = [f for f in plan.files if os.path.join(f.admin, f.rel) not in applied]
        plan.refused += [
            f"{os.path.join(f.admin, f.rel)}: the host changed it meanwhile; the host's kept"
            for f in skipped
        ]
        if lost or skipped:
            held = [h.keeps for h in plan.heads if os.path.join(h.admin, "HEAD") in lost]
            held += [f.keeps for f in skipped]
            kept = keep_prefix if any(held) else None
            return self._outcome(GitImportStatus.PARTIAL, applied=applied, kept=kept)
        return self._outcome(GitImportStatus.APPLIED, applied=applied)

    def settle(self) -> None:
        """Each ref the host moved meanwhile that the command changed too: a fast-forward
        when git finds the host's value an ancestor of the command's (its objects are the
        host's now, checked), then moved with a compare-and-swap on the host's value, so a
        host change racing the import is still a conflict; any other is a conflict, and so
        is an index staged on it."""
        changes = {c.name: c for c in self.plan.refs}
        for name, host in sorted(self.fast_forwards.items()):
            change = changes[name]
            assert change.new is not None
            undone = self._undoes(change.old, host, ("diff-tree", host, change.new))
            if undone:
                # The command read the ref through the live git dir but committed an index
                # staged before the host's commit: a fast-forward that deletes the host's
                # work (a red team's: a user's commit during a background command).
                self.result.denials.append((name, _UNDOES.format(undone)))
            if not undone and self._forward(change.old, host, change.new):
                change.old = host
                self.forwarded.add(name)
            else:
                self.plan.conflicts.append(GitRefConflict(name=name, host=host, command=change.new))
        for admin, name in sorted(self.index_on.items()):
            undone = None
            if name in self.forwarded:
                # The index staged on the moved tip: the same question of its entries.
                host, start = self.fast_forwards[name], (self.snap.refs or {}).get(name)
                index = next(c.source for c in self.plan.indexes if c.admin == admin)
                env = git_env(GIT_INDEX_FILE=index)
                undone = self._undoes(start, host, ("diff-index", "--cached", host), env)
                if undone:
                    self.result.denials.append((f"{admin or '.'}/index", _UNDOES.format(undone)))
            if undone or (name not in self.forwarded and self._index_changed(admin)):
                self.plan.conflicts.append(
                    GitRefConflict(
                        name=os.path.join(admin, "index"), host="changed", command="changed"
                    )
                )

    def _undoes(
        self,
        start: str | None,
        host: str,
        command: tuple[str, ...],
        env: dict[str, str] | None = None,
    ) -> str | None:
        """A path the host changed between ``start`` (None: the branch was born meanwhile)
        and ``host`` that the command's side (``command``: a git diff against ``host``)
        changes too; None when it leaves every path the host changed as the host has it."""
        if start == host:
            return None
        if start is None:  # born meanwhile: everything in the host's tip is the host's
            empty = git(self.gitdir, "hash-object", "-t", "tree", "--stdin", input=b"")
            start = empty.stdout.decode().strip()
        flags = ("-r", "-z", "--no-renames", "--no-ext-diff")
        theirs = _raw_diff(git(self.gitdir, "diff-tree", *flags, start, host).stdout)
        if not theirs:
            return None
        mine = _raw_diff(git(self.gitdir, command[0], *flags, *command[1:], env=env).stdout)
        # A path both changed is a merge's conflict whatever the command's entry: its
        # stale index with its own edit of the file drops the host's edit as surely.
        both = sorted(set(theirs) & set(mine))
        return both[0].decode(errors="replace") if both else None

    def _forward(self, start: str | None, host: str, command: str) -> bool:
        """Whether the host moved the ref forward (its value at the snapshot an ancestor of
        its value now: a rewind, `git reset --hard HEAD~`, is the host's to keep) and the
        command's value descends from the host's."""
        for old, new in ((host, command), (start, host)):
            if old is None:
                continue  # made by the host meanwhile: no value of its own to rewind
            done = git(self.gitdir, "merge-base", "--is-ancestor", old, new, check=False)
            if done.returncode != 0:
                return False
        return True

    def _unchanged_under_lock(self, journal: Journal) -> None:
        """Each index the plan rebuilt, checked again now that git's own `index.lock` is
        ours (git's rule: lock, then compare): a host `git add` or `git commit` while the
        objects were fetched changed the index or moved the branch it was staged against,
        and installing the rebuilt one would drop that work. Raises Conflict."""
        refs: dict[str, str] | None = None
        moved = {c.name for c in journal.refs}  # compared and swapped by the ref update
        for change in journal.indexes:
            admin = change.admin
            if admin in self.index_on:
                changed = not self._only_tip(admin)  # on a fast-forward: the tip's tree only
            else:
                changed = self._index_changed(admin)
            if changed:
                raise Conflict(os.path.join(admin, "index"), "changed", "changed")
            head = _read_head(self.gitdir, admin)
            if head != self.snap.heads.get(admin):
                raise Conflict(os.path.join(admin, "HEAD"), head, "index")
            branch = _branch(head)
            if branch is None or branch in moved:
                continue
            refs = host_refs(self.gitdir) if refs is None else refs
            if refs.get(branch) != (self.snap.refs or {}).get(branch):
                raise Conflict(branch, refs.get(branch), "index")

    def _only_tip(self, admin: str) -> bool:
        """Whether the host's index of ``admin`` is exactly the tree of the host's value of
        the ref its new index rides on (`index_on`, a fast-forward): nothing the host
        staged is lost when it is replaced. Asked under git's index lock."""
        name = self.index_on[admin]
        if name not in self.forwarded:
            return False
        env = git_env(GIT_INDEX_FILE=os.path.join(self.gitdir, admin, "index"))
        args = ("diff-index", "--cached", "--quiet", self.fast_forwards[name], "--")
        return git(self.gitdir, *args, env=env, check=False).returncode == 0

    def _refs_removed_whole(self) -> bool:
        """Whether the command removed `refs`, `refs/heads` or `refs/tags` as a directory
        (a whiteout on it or above it, or an opaque one made again): git itself never does."""
        return any(
            self.scan.removed(d) or d in self.scan.opaque
            for d in ("refs", "refs/heads", "refs/tags")
        )

    def _checked_out_kept(self) -> set[str]:
        """The branches a HEAD names once the import is done, which it must not delete (as
        git refuses to delete a checked-out branch): the command's HEAD names its own (even
        rewritten with the same bytes), and the host's HEAD its own where the command left
        it, removed it (never imported), detached it, or pointed it at a branch that will
        not exist (`rm -rf .git && git init`: an unborn `master`, every ref deleted)."""
        if self.kept_heads is None:
            kept: set[str] = set()
            for admin in _admins(self.gitdir):
                if os.path.join(admin, "HEAD") in self.scan.files:
                    ours = _symref(self._view_admin(admin))
                    if ours is not None:
                        kept.add(ours)
                        if ours in self.view_refs:
                            continue  # another branch checked out: the host's may go
                host = _symref(os.path.join(self.gitdir, admin))
                if host is not None:
                    kept.add(host)
            self.kept_heads = kept
        return self.kept_heads

    def _checked_out_outside(self) -> dict[str, str]:
        """The branches each worktree outside the roots has checked out -> that admin dir:
        its `HEAD`'s target (as git reads the host's admin dir), and, as git's
        `die_if_checked_out` counts them, the branch it is bisecting or rebasing (`HEAD`
        detached meanwhile; `git bisect reset` or the rebase's end checks it out again).
        Read once, at the first ref or state file that asks."""
        if self.outside_heads is not None:
            return self.outside_heads
        found: dict[str, str] = {}
        for admin in _admins(self.gitdir):
            if self._within_roots(admin):
                continue
            got = git(os.path.join(self.gitdir, admin), "symbolic-ref", "-q", "HEAD", check=False)
            if got.returncode == 0:
                found[got.stdout.decode(errors="surrogateescape").rstrip("\n")] = admin
            for name in ("BISECT_START", "rebase-merge/head-name", "rebase-apply/head-name"):
                try:
                    data = read_regular(os.path.join(self.gitdir, admin, name), 4096)
                except OSError:
                    continue
                branch = sf.checked_out_branch(data)
                if branch is not None:
                    found.setdefault(branch, admin)
        self.outside_heads = found
        return found

    def _within_roots(self, admin: str) -> bool:
        if admin not in self.within:
            self.within[admin] = self._worktree_within_roots(admin)
        return self.within[admin]

    def _worktree_within_roots(self, admin: str) -> bool:
        """Whether the worktree of ``admin`` lies in the roots: a linked one
        (`worktrees/<name>`) as git reads the host's `gitdir` (never one this import
        writes: a command re-pointing an outside worktree's would make it count as inside),
        or, for an admin dir the host has never had, the one the command added (checked as
        `plan_loose` checks it); the main one ("") as `_main_within_roots` finds it."""
        if not admin:
            return self._main_within_roots()
        host = self._host_gitdir(admin)
        if host is not None:
            # `gitdir` names the worktree's `.git` file: the worktree is its directory.
            return sf.worktree_inside(host, self.snap.roots)
        if admin in self.snap.heads or os.path.lexists(os.path.join(self.gitdir, admin)):
            return False  # the host's, with no `gitdir` to tell where it is
        try:
            data = read_regular(os.path.join(self.upper, admin, "gitdir"), sf.MAX_TEXT)
        except OSError:
            return False
        path = sf.canonical_gitdir(data)
        return path is not None and within_any(path, tuple(self.snap.roots))

    def _main_within_roots(self) -> bool:
        """Whether the main worktree of this git directory lies in the roots, found as git
        finds it: `core.worktree` in the host's config (relative to the git directory; read
        by git, with `config.worktree` where the repository uses it), else the directory
        holding a git directory named `.git`. A bare one (`core.bare`) has no checkout to
        write. Git cannot place the checkout of a separate git directory (a `.git` file
        names it): there the snapshot's `main_inside` decides, unknown taken as outside."""
        got = git(self.gitdir, "config", "--get", "core.worktree", check=False)
        value = os.fsdecode(got.stdout.rstrip(b"\n")) if got.returncode == 0 else ""
        if value:
            main = os.path.join(self.gitdir, value)
        elif os.path.basename(self.gitdir) == ".git":
            main = os.path.dirname(self.gitdir)
        else:
            bare = git(self.gitdir, "config", "--type=bool", "--get", "core.bare", check=False)
            return bare.stdout.strip() == b"true" or bool(self.snap.main_inside)
        return within_any(os.path.realpath(main), self.snap.roots)

    def _transfer(self, keep_prefix: str) -> dict[str, str] | None:
        """Every object the plan names, into the host's store through `git fetch` with git's
        object checks (fsck: hashes, trees with `.git` or `..`), held by keep-refs: first
        what refs and HEADs name, then the blobs a new index names that the host still
        lacks (a tree of them). None when git refused them."""
        keep: dict[str, str] = {}
        if self.plan.carrier and not self._fetch(self.plan.carrier, keep_prefix, keep):
            return None
        lacking: dict[str, None] = {}
        for blobs in self.index_blobs.values():
            lacking.update(dict.fromkeys(blobs))
        if lacking:
            # Those the view lacks too are no one's here: a partial clone's promised blobs
            # (outside a sparse cone), which the host's index names already.
            host_lacks = self._host_lacks(lacking)
            nowhere = self._absent(self.view, host_lacks) if host_lacks else set()
            lacking = dict.fromkeys(sorted(host_lacks - nowhere))
        if not lacking:
            return keep
        tree = git(
            self.view,
            "mktree",
            "-z",
            input=b"".join(f"100644 blob {o}\t{o}\0".encode() for o in lacking),
            check=False,
        )
        if tree.returncode != 0:
            self.plan.refused.append("index: names objects that do not exist")
            return keep
        if not self._fetch({"index": tree.stdout.decode().strip()}, keep_prefix, keep):
            return None
        return keep

    def _fetch(self, carrier: dict[str, str], keep_prefix: str, keep: dict[str, str]) -> bool:
        lines = [f"update {_CARRIER}/{suffix} {oid}" for suffix, oid in carrier.items()]
        before = _temp_objects(self.gitdir)
        started = time.time_ns()
        names = [f"+{_CARRIER}/{suffix}:{keep_prefix}/{suffix}" for suffix in carrier]
        try:
            # The view is scratch: its carrier refs are only the fetch's source (a crash
            # rebuilds it), so they are not flushed to disk (3 flushes, 4-7 ms here). What
            # the host receives is: the fetch and the host's ref updates keep git's fsyncs.
            git(
                self.view,
                *SCRATCH_OPTIONS,
                "update-ref",
                "--stdin",
                input=("\n".join(lines) + "\n").encode(),
            )
            git(
                self.gitdir,
                "-c", "fetch.fsckObjects=true",
                "-c", "transfer.fsckObjects=true",
                "-c", "fetch.prune=false",
                "fetch", "--atomic", "--no-tags", "--no-write-fetch-head", "--no-auto-gc",
                "--no-recurse-submodules", "--no-show-forced-updates", "--quiet",
                "--stdin",
                self.view,
                input=("\n".join(names) + "\n").encode(),
            )  # fmt: skip
        except GitError as exc:
            # A failed fetch (a full disk) leaves its temporary pack: ours, removed.
            for path in (_temp_objects(self.gitdir) - before) | _loose_temps(self.gitdir, started):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self.plan.refused.append(f"objects: git refused them ({exc.stderr.strip()[-300:]})")
            kept = keep_prefix if keep else None
            self.result.outcome = self._outcome(GitImportStatus.REFUSED, kept=kept).outcome
            return False
        keep.update({f"{keep_prefix}/{suffix}": oid for suffix, oid in carrier.items()})
        return True

    def _outcome(
        self, status: GitImportStatus, *, kept: str | None = None, applied: list[str] | None = None
    ) -> ImportResult:
        self.result.outcome = GitImportOutcome(
            repository=self.gitdir,
            status=status,
            kept_at=kept,
            applied=tuple(applied or ()),
            conflicts=tuple(self.plan.conflicts),
            refused=tuple(self.plan.refused),
        )
        return self.result


_UNDOES = (
    "staged before the host moved the same branch: at {} it differs from what the host "
    "committed there, and taking it would undo that (the command's commits and index are "
    "kept, the host's stay)"
)


def _merged_reflog(host: bytes, mine: bytes) -> bytes:
    """The host's reflog with the command's entries it lacks appended (the command's copy
    began as the host's at its first write). An entry the command removed that the host
    still has stays (a dropped stash comes back: nothing of the host's is lost)."""
    theirs = host.splitlines(keepends=True)
    ours = mine.splitlines(keepends=True)
    common = 0
    for a, b in zip(theirs, ours, strict=False):
        if a != b:
            break
        common += 1
    if common == len(theirs):
        return mine  # the command's copy holds every host entry
    seen = set(theirs)
    return b"".join([*theirs, *(line for line in ours[common:] if line not in seen)])


def _raw_diff(out: bytes) -> dict[bytes, tuple[tuple[bytes, bytes], tuple[bytes, bytes]]]:
    """`git diff --raw -z` output: each path's (mode, id) before and after (zeros: absent)."""
    parts = out.split(b"\0")
    found: dict[bytes, tuple[tuple[bytes, bytes], tuple[bytes, bytes]]] = {}
    for meta, path in zip(parts[::2], parts[1::2], strict=False):
        fields = meta.lstrip(b":").split(b" ")
        if len(fields) >= 4:
            found[path] = ((fields[0], fields[2]), (fields[1], fields[3]))
    return found


def _temp_objects(gitdir: str) -> set[str]:
    """Git's temporary object files (`tmp_pack_*`, `tmp_idx_*`, `tmp_obj_*`)."""
    objects = os.path.join(gitdir, "objects")
    found: set[str] = set()
    for sub in ("pack", ""):
        with contextlib.suppress(OSError):
            found.update(
                e.path for e in os.scandir(os.path.join(objects, sub)) if e.name.startswith("tmp_")
            )
    return found


def _loose_temps(gitdir: str, since_ns: int) -> set[str]:
    """Temporary loose objects (`objects/xx/tmp_obj_*`) made since ``since_ns``."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for sub in os.scandir(os.path.join(gitdir, "objects")):
            if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                found.update(
                    e.path
                    for e in os.scandir(sub.path)
                    if e.name.startswith("tmp_") and e.stat().st_mtime_ns >= since_ns
                )
    return found


def _symref(gitdir: str) -> str | None:
    """The ref ``gitdir``'s HEAD names, as git reads it (None: detached, or unreadable)."""
    got = git(gitdir, "symbolic-ref", "-q", "HEAD", check=False)
    if got.returncode != 0:
        return None
    return got.stdout.decode(errors="surrogateescape").rstrip("\n")


def _branch(head: str | None) -> str | None:
    """The ref a raw HEAD names when symbolic, as the import writes one; None otherwise."""
    return head[5:].strip() if head and head.startswith("ref: ") else None


def _detached(head: str | None) -> str:
    """The object id a raw HEAD names when detached; "" for a branch or none."""
    return "" if head is None or head.startswith("ref:") else head.strip()


def _hexlen(snap: Snapshot) -> int:
    for oid in (snap.refs or {}).values():
        return len(oid)
    out = git(snap.gitdir, "rev-parse", "--show-object-format").stdout.strip()
    return 64 if out == b"sha256" else 40


def import_changes(
    snap: Snapshot,
    *,
    skip: frozenset[str] = frozenset(),
    cap: int = GIT_STATE_CAP_BYTES,
    keep_only: bool = False,
    work_base: str | None = None,
) -> ImportResult:
    """Import what the command wrote in ``snap.upper`` into ``snap.gitdir``: validated by
    git, applied as one transaction, a conflict or refusal kept and reported. ``skip``:
    paths of the upper layer the executor made itself (placeholders). ``work_base``: where
    the view and journal go (default: beside the upper layer, in the executor's state)."""
    try:
        scan = scan_upper(snap.upper, skip=skip, cap=cap)
    except ScanRefused as exc:
        outcome = GitImportOutcome(
            repository=snap.gitdir, status=GitImportStatus.REFUSED, refused=(str(exc),)
        )
        return ImportResult(outcome=outcome)
    if scan.empty():
        return ImportResult()
    if snap.refs is None:
        # Not a repository host git reads: none of it is imported (git would not use it).
        why = "not imported: the host directory is not a git repository"
        return ImportResult(denials=[(rel, why) for rel in sorted(scan.files)[:64]])
    base = work_base or os.path.join(os.path.dirname(snap.upper), IMPORT_DIR)
    work = os.path.join(base, "work")
    if os.path.exists(work):
        remove_work(work)
    os.makedirs(work)
    hexlen = _hexlen(snap)
    importer = _Importer(snap, scan, work, hexlen)
    left_out = build_view(
        importer.view, snap.gitdir, snap.upper, scan, object_format=importer.object_format
    )
    importer.result.denials += [(rel, "not an object file") for rel in left_out]
    importer.result.denials += [(rel, "not a regular file") for rel in scan.odd]
    result = importer.run(keep_only=keep_only)
    _import_modules(snap, base, result, keep_only=keep_only)
    if (
        work_base is None
        and result.unimported
        and not keep_only
        and not _host_lacks_room(snap.gitdir, scan.total)
        and not executor_state.room_to_keep(snap.upper)
    ):
        # The host had room, so git refused the objects for what they are (or a quota, a
        # read-only store): a first import past the bound of kept layers is refused as any
        # other, and says so. A full disk's is always kept: no commit is lost to it.
        result.unimported = False
        if result.outcome is not None:
            waiting = f"{executor_state.KEPT_MAX} imports of this uid already wait for the host"
            refused = (*result.outcome.refused, f"not kept: {waiting}")
            result.outcome = result.outcome.model_copy(update={"refused": refused})
    if work_base is None and result.unimported:
        # The intent stays, and says so: the upper layer is kept and imported later.
        with open(os.path.join(base, UNIMPORTED), "w"):
            pass
    elif work_base is None:
        # Done (applied, refused with what git took kept, or a conflict with the commits in
        # keep-refs): a recovery has nothing left to import from here.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(base, INTENT))
    return result


def _host_lacks_room(gitdir: str, upper_bytes: int) -> bool:
    """Whether the host repository's filesystem lacks the room the fetch of at most
    ``upper_bytes`` of objects writes (a pack of them, its index: twice that, and a MiB),
    or a few inodes. Unknown counts as lacking (the layer is then kept)."""
    try:
        st = os.statvfs(os.path.join(gitdir, "objects"))
    except OSError:
        return True
    inodes_short = st.f_files > 0 and st.f_favail < 64  # btrfs reports no inode count
    return st.f_bavail * st.f_frsize < 2 * upper_bytes + (1 << 20) or inodes_short


def _import_modules(snap: Snapshot, base: str, result: ImportResult, *, keep_only: bool) -> None:
    """Each submodule's git directory the command changed, imported on its own; one it
    created, into a new repository with git's default control plane (`import_created`)."""
    modules_upper = os.path.join(snap.upper, "modules")
    if not os.path.isdir(modules_upper):
        return
    for i, rel in enumerate(sorted(snap.modules)):
        sub_upper = os.path.join(modules_upper, rel)
        if not os.path.isdir(sub_upper):
            continue
        sub = Snapshot(**{**snap.modules[rel], "upper": sub_upper, "modules": {}})
        done = import_changes(sub, keep_only=keep_only, work_base=os.path.join(base, f"m{i}"))
        result.unimported |= done.unimported
        result.modules += [o for o in (done.outcome, *done.modules) if o is not None]
        result.denials += _module_denials(rel, done.denials)
    for j, rel in enumerate(_module_dirs(modules_upper[: -len("/modules")])):
        host = os.path.join(snap.gitdir, "modules", rel)
        if rel in snap.modules or os.path.lexists(host) or keep_only:
            continue
        made = import_created(
            os.path.join(modules_upper, rel),
            host,
            os.path.join(base, f"new{j}"),
            run_id=f"{snap.run_id}-new{j}",
            worktree_within=os.path.dirname(snap.gitdir),
            roots=snap.roots,
        )
        result.modules += [o for o in (made.outcome, *made.modules) if o is not None]
        result.denials += _module_denials(rel, made.denials)


def _module_denials(rel: str, denials: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A submodule's discarded writes, named from the parent's git directory; git's own
    `*.sample` hooks (written by every `git submodule add`, never run) are not refusals."""
    return [
        (f"modules/{rel}/{name}", why)
        for name, why in denials
        if not (name.startswith("hooks/") and name.endswith(".sample"))
    ]


def recover(state_dir: str) -> bool:
    """Finish or undo every import a dead executor left in ``state_dir``, and import the
    commits of any command it never imported into keep-refs; True when its state may be
    removed (nothing there is the only copy of a commit any more)."""
    root = os.path.join(state_dir, "git")
    try:
        bases = sorted(os.listdir(root))
    except OSError:
        return True
    safe = True
    for name in bases:
        safe = recover_overlay(os.path.join(root, name, "upper")) and safe
    return safe


def may_keep(gitdir: str, upper: str) -> bool:
    """Whether the upper layer at ``upper`` may be kept for a later import: the host's disk
    is full (no commit is lost to it), or fewer than `KEPT_MAX` layers wait already."""
    return _host_lacks_room(gitdir, 0) or executor_state.room_to_keep(upper)


def mark_unimported(upper: str) -> bool:
    """Mark the upper layer at ``upper`` as the only copy of the command's objects (kept out
    of the executor's state, imported by a later executor): for an import that failed before
    it could say so itself. False when even the mark could not be written."""
    base = os.path.join(os.path.dirname(upper), IMPORT_DIR)
    try:
        os.makedirs(base, 0o700, exist_ok=True)
        os.close(os.open(os.path.join(base, UNIMPORTED), os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        return False
    return True


def recover_overlay(upper: str) -> bool:
    """`recover` for one overlay (its upper layer's path); True when nothing is left."""
    imp = os.path.join(os.path.dirname(upper), IMPORT_DIR)
    # The repository's journal, and its submodules' (`m<i>/work/journal.json`).
    journals = [os.path.join(imp, "work", JOURNAL)]
    with contextlib.suppress(OSError):
        journals += [os.path.join(imp, d, "work", JOURNAL) for d in sorted(os.listdir(imp))]
    try:
        found = [j for j in journals if os.path.exists(j)]
        for journal in found:
            recover_journal(journal)
            os.unlink(journal)
        if not found and os.path.exists(os.path.join(imp, INTENT)):
            snap = load_snapshot(upper)
            usable = snap is not None and os.path.isdir(snap.gitdir)
            kept = import_changes(snap, keep_only=True) if snap is not None and usable else None
            if kept is not None and kept.unimported:
                return False  # still the only copy of its objects: kept, tried later
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(imp, INTENT))
    except Exception:
        return False
    return True


# -- a repository the command created ---------------------------------------------------------


def import_created(
    source_gitdir: str,
    host_gitdir: str,
    work: str,
    *,
    run_id: str,
    worktree_within: str | None = None,
    roots: Iterable[str] = (),
) -> ImportResult:
    """Make ``host_gitdir`` a new repository with git's default control plane (`git init`
    with no template: no hooks, config git writes itself), then import ``source_gitdir``'s
    objects, refs, HEAD and index into it as a command's changes over an empty repository.
    ``source_gitdir`` is untrusted (the command's, moved aside by the caller); ``work`` is
    an empty directory of the executor's (its view and journal go there); ``run_id`` names
    the keep-refs. ``host_gitdir`` must not exist yet. A submodule's `core.worktree` (read
    with git's config parser) is kept when it leads inside ``worktree_within`` to a real
    directory, no symlink on the way. ``roots``: the command's writable roots (its HEAD and
    index are imported only when its worktree lies in one)."""
    os.makedirs(os.path.dirname(host_gitdir), exist_ok=True)
    git(host_gitdir, "init", "--bare", "-q", "--template=", host_gitdir)
    git(host_gitdir, "config", "core.bare", "false")
    _keep_data_config(source_gitdir, host_gitdir)
    if worktree_within is not None:
        _keep_worktree(source_gitdir, host_gitdir, worktree_within)
    snap = Snapshot(
        gitdir=host_gitdir,
        upper=source_gitdir,
        run_id=run_id,
        refs=host_refs(host_gitdir),
        heads={"": _head(host_gitdir)},
        indexes={"": None},
        roots=list(roots),
    )
    os.makedirs(work, exist_ok=True)
    return import_changes(snap, work_base=work)


def _keep_data_config(source: str, host_gitdir: str) -> None:
    """The command's remotes, branch tracking and submodule URLs, read by git's parser and
    kept by the allowlist a created repository's config keeps (`git_created.data_pairs`):
    `git submodule add` writes the new submodule's `origin`, and without it the user's
    `git -C sub pull` had no remote (a usability pass)."""
    try:
        data = read_regular(os.path.join(source, "config"), 1 << 20)
    except OSError:
        return
    for key, value in data_pairs(parse_config(data) or [])[:256]:
        git(host_gitdir, "config", "--add", key, value, check=False)


def _keep_worktree(source: str, host_gitdir: str, within: str) -> None:
    got = git(
        "/nonexistent",
        "config",
        "--file",
        os.path.join(source, "config"),
        "--get",
        "core.worktree",
        check=False,
    )
    value = got.stdout.decode(errors="replace").strip()
    target = os.path.normpath(os.path.join(host_gitdir, value))
    # Only a real directory reached without a symlink: a link inside the workspace that a
    # later command re-points would carry the user's checkouts there wherever it points.
    # And only the submodule's own checkout, whose `.git` file names this git directory (as
    # `git submodule add` leaves it): `../..` is the superproject's `.git`, where host git in
    # the submodule (`git submodule foreach git reset --hard`) then checked out the
    # command's `hooks/pre-commit` (a red team's). Never a directory in a `.git`.
    if (
        value
        and "\n" not in value
        and within_path(target, within)
        and os.path.isdir(target)
        and os.path.realpath(target) == target
        and ".git" not in os.path.relpath(target, within).lower().split("/")
        and read_gitfile(os.path.join(target, ".git")) == os.path.realpath(host_gitdir)
    ):
        git(host_gitdir, "config", "core.worktree", value)


def _head(gitdir: str) -> str | None:
    return read_regular(os.path.join(gitdir, "HEAD"), 4096).decode(errors="replace")
