"""Which git repositories a command can reach through its writable roots, found completely.

Before a command, every `.git` entry in every writable root is found, at any depth, and
every bare repository (a directory git's `is_git_directory` takes, under any name), so each
git directory gets an overlay (`git_plane.py`): a directory, a `.git` symlink
(followed, as git's `stat` follows it) or a gitfile (read with git's own rules: the exact
`gitdir: ` prefix, trailing newlines cut, relative to the directory holding it). Dependency
and cache directories (`DEPENDENCY_DIRS`: `.venv`, `node_modules`, ...) are searched too,
last: pip puts editable VCS checkouts in `.venv/src/<pkg>`, and a host user may run git
there. The search is breadth first and bounded (`DISCOVERY_BUDGET` directories per search),
for pathological trees only; when the bound is hit the run is `partial` and the warning
names the directories it did not list.

Listing every directory before every command would cost a `scandir` per directory. A
listing is cached by the directory's (device, inode, ctime): adding, removing or renaming an
entry changes the ctime, and so does every `utimensat`, which a command cannot set back
(ctime is the kernel's clock). A listing made within a clock tick of the directory's last
change is not cached (a second change in the same tick would keep its ctime), nor one of a
directory with git's layout (its `HEAD` rewritten in place changes no ctime). A search
whose directories did not change costs one `lstat` per directory. An executor answers the
same search from a tree inotify keeps current (`git_tree_watch.py`), and with this walk
whenever it cannot show that tree is current.

After the command, `after_command` searches again: a `.git` entry that was not there before
is a repository the command created (its control plane is reset, `git_created.py`); a
`.git` symlink or gitfile that was there and changed is put back as it was (its bytes are
kept in the discovery). `index_gitlinks` reads an index with git's own parser to report
the gitlinks (submodules) a command added, whatever the index version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import stat
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from bash_local.userdir import user_base_dir
from bash_sandbox.birth_time import birth_ns
from bash_sandbox.host_run import run_bounded
from bash_sandbox.linux.binaries import host_git, host_git_path
from bash_sandbox.safe_read import read_regular, read_small_text
from policies import SandboxPolicy
from policies.paths import within, within_any

# Listed last (and below them, everything): installed dependencies and caches, where a
# repository is rare but possible (`pip install -e git+...` checks out into `.venv/src`).
DEPENDENCY_DIRS = frozenset(
    {
        "node_modules",
        ".venv",
        "venv",
        "__pycache__",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".cache",
        ".gradle",
        "target",
    }
)
# Directories visited per search (all roots together). Far above any real workspace (the
# 100k-file benchmark has ~11k); a flood beyond it makes the run partial and is named.
DISCOVERY_BUDGET = 200_000
_NAMED_UNSEARCHED = 5
_GITFILE_MAX = 1 << 16
# A listing this close to the directory's last change is not cached (same-tick changes).
_RACY_NS = 100_000_000
_CACHE_MAX = 250_000  # listings kept (a few hundred bytes each)


@dataclass(frozen=True)
class Listing:
    """What the search takes from one directory."""

    subdirs: tuple[str, ...]  # full paths, sorted
    dependencies: tuple[str, ...]  # the subdirectories named in DEPENDENCY_DIRS
    dotgit: bool
    bare: bool  # the directory itself is a git directory (a bare repository)
    # `HEAD` with `objects` and `refs`, or with `commondir`: git's verdict can change with
    # no name changing (HEAD rewritten in place, a symlink retargeted), so never kept.
    layout: bool = False


EMPTY_LISTING = Listing((), (), False, False)
_LISTINGS: dict[str, tuple[tuple[int, int, int], Listing]] = {}  # st_dev, st_ino, st_ctime_ns


@dataclass(frozen=True)
class DotGit:
    """One `.git` entry as found: its kind and, for a symlink or a gitfile, its content
    (the link's target, the file's bytes) so a change can be undone."""

    path: str
    kind: str  # "dir", "link", "file", "other"
    content: bytes | None = None
    # Where a link or gitfile leads, resolved when found: the same bytes can lead elsewhere
    # once a link on the way is replaced (`after_command`).
    target: str | None = None


@dataclass(frozen=True)
class GitDiscovery:
    """The git directories a command could reach through the writable roots.

    ``unsearched`` names the first directories a search cut short by its budget did not
    list (``unsearched_total`` counts them all); ``entries`` are the `.git` entries found,
    as they were."""

    gitdirs: tuple[str, ...]
    unsearched: tuple[str, ...] = ()
    unsearched_total: int = 0
    entries: tuple[DotGit, ...] = ()
    roots: tuple[str, ...] = ()

    @property
    def dotgits(self) -> tuple[str, ...]:
        return tuple(e.path for e in self.entries)

    @property
    def partial(self) -> tuple[str, ...]:
        """Why this search leaves the run partial, naming what it did not cover."""
        if not self.unsearched_total:
            return ()
        more = self.unsearched_total - len(self.unsearched)
        named = ", ".join(self.unsearched) + (f" and {more} more" if more > 0 else "")
        return (
            f"git: the repository search stopped after {DISCOVERY_BUDGET} directories; "
            f"not searched: {named} (a repository there has no overlay: its config and hooks "
            "are writable)",
        )


def gitfile_target(data: bytes, whole: bool = True) -> bytes | None:
    """The path a gitfile's bytes name, in git's order (`read_gitfile_gently`): the
    `gitdir: ` prefix, then trailing CR/LF cut from the whole file, then the C string up to
    the first NUL. So `gitdir: x\\n\\0` names `x\\n` (the NUL keeps the newline), and
    `gitdir: x\\0\\n` names `x`. ``whole``: ``data`` is the whole file (else only its
    start, and a path with no NUL there is longer than any path git opens)."""
    if not data.startswith(b"gitdir: "):
        return None
    if whole:
        data = data.rstrip(b"\r\n")
    path, nul, _ = data[8:].partition(b"\0")
    if not (whole or nul):
        return None
    return path or None


def read_gitfile(path: str) -> str | None:
    """The directory a gitfile (linked worktree, submodule) names, absolute and resolved,
    read as git reads it (`gitfile_target`), relative to the directory of ``path``."""
    try:
        data = read_regular(path, _GITFILE_MAX + 1)
    except OSError:
        return None
    named = gitfile_target(data[:_GITFILE_MAX], whole=len(data) <= _GITFILE_MAX)
    if named is None:
        return None
    target = os.fsdecode(named)
    if not target:
        return None
    if not os.path.isabs(target):
        target = os.path.join(os.path.dirname(path), target)
    return resolved(target)


def enclosing_gitdirs(roots: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(git dir, worktree) of every repository a root lies in below its top (a workspace
    that is a monorepo's package, a submodule of a superproject, a directory of a linked
    worktree), each as git finds it from its worktree: the `.git` of every directory above
    the root. Their configs and hooks are the host's and outside the roots, but what they
    name inside a root runs there (husky's `core.hooksPath = frontend/.husky/_`, a
    superproject's shared hooks kept in a submodule: red teams')."""
    found: dict[str, str] = {}
    for root in roots:
        parent = os.path.dirname(root)
        for _ in range(_ENCLOSING_DEPTH):
            if not parent or parent == os.path.dirname(parent):
                break
            dotgit = os.path.join(parent, ".git")
            if os.path.isdir(dotgit):
                gitdir = resolved(dotgit)
            elif os.path.isfile(dotgit):
                gitdir = read_gitfile(dotgit)
            else:
                gitdir = None
            if gitdir is not None and is_git_directory(gitdir):
                found.setdefault(gitdir, parent)
            parent = os.path.dirname(parent)
    return tuple((g, w) for g, w in found.items() if not within_any(g, roots))


_ENCLOSING_DEPTH = 64


def outside_gitdirs(
    entries: tuple[DotGit, ...], roots: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """(git dir, worktree) of each checkout among ``entries`` whose `.git` file or link
    leads out of ``roots`` to a repository (a separate git dir, a linked worktree of one
    kept elsewhere)."""
    found: dict[str, str] = {}
    for entry in entries:
        target = entry.target if entry.kind in ("file", "link") else None
        if target is not None and not within_any(target, roots) and is_git_directory(target):
            found.setdefault(target, os.path.dirname(entry.path))
    return tuple(found.items())


def worktrees_of(entries: tuple[DotGit, ...]) -> dict[str, str]:
    """Git dir -> the worktree whose `.git` entry (among ``entries``) leads to it: a linked
    worktree's, a submodule's or a separate git dir's is not the git dir's parent, and a
    relative hooks path is relative to the worktree (a red team's)."""
    found: dict[str, str] = {}
    for entry in entries:
        gitdir = resolved(entry.path) if entry.kind == "dir" else entry.target
        if gitdir is not None:
            found.setdefault(gitdir, os.path.dirname(entry.path))
    return found


def resolved(path: str) -> str | None:
    """``os.path.realpath(path)``, or None where it raises: a link to another process's
    `/proc/<pid>/cwd` (EACCES) or a chain of a thousand links (RecursionError), which a
    command can leave for the search and the reset after it (a red team's skipped the reset
    of the repositories it made, and crashed every later call)."""
    try:
        return os.path.realpath(path)
    except (OSError, RecursionError, ValueError):
        return None


def _list(directory: str, now_ns: int) -> Listing | None:
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_ctime_ns)
    cached = _LISTINGS.get(directory)
    if cached is not None and cached[0] == key:
        return cached[1]
    if not stat.S_ISDIR(st.st_mode):
        return None
    listing = _scan(directory)
    if listing is not None and not listing.layout and st.st_ctime_ns < now_ns - _RACY_NS:
        if len(_LISTINGS) >= _CACHE_MAX:
            _LISTINGS.clear()
        _LISTINGS[directory] = (key, listing)
    return listing


def scan_directory(directory: str) -> Listing | None:
    """``directory`` listed now (None when it is not a directory, or cannot be listed)."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return None
    except OSError:
        return None
    return _scan(directory)


def _entries(directory: str) -> list[os.DirEntry[str]]:
    """What `os.scandir` lists; a directory this uid owns and may enter but not list (`chmod 0311`,
    a command's way to hide a repository from the search while host git, which only needs to
    enter it, still finds it) gets its owner's read permission back first."""
    try:
        with os.scandir(directory) as it:
            return list(it)
    except PermissionError:
        fd = os.open(directory, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd)
            if mode.st_uid != os.geteuid() or mode.st_mode & stat.S_IRUSR:
                raise
            if not mode.st_mode & stat.S_IXUSR:
                raise  # not enterable: git cannot reach below it either
            # Through the descriptor: a name swapped for a symlink meanwhile changes nothing.
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(mode.st_mode) | stat.S_IRUSR)
        finally:
            os.close(fd)
        with os.scandir(directory) as it:
            return list(it)


def _scan(directory: str) -> Listing | None:
    subdirs: list[str] = []
    dependencies: list[str] = []
    dotgit = False
    names: set[str] = set()
    prefix = directory.rstrip("/") + "/"
    try:
        entries = _entries(directory)
    except OSError:
        return None
    for entry in entries:
        if entry.name == ".git":
            dotgit = True
            continue
        if entry.name in _BARE_NAMES:
            names.add(entry.name)
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                into = dependencies if entry.name in DEPENDENCY_DIRS else subdirs
                into.append(prefix + entry.name)
    # HEAD with objects and refs, or with a commondir naming where they are.
    has_layout = "HEAD" in names and (names >= {"objects", "refs"} or "commondir" in names)
    bare = has_layout and is_git_directory(directory)
    return Listing(tuple(sorted(subdirs)), tuple(sorted(dependencies)), dotgit, bare, has_layout)


def executor_dirs() -> frozenset[str]:
    """Where executors of this uid keep their state and spills (`state.py`): never searched.
    An overlay's upper layer there looks like a bare repository, and is not the user's."""
    return _executor_dirs(user_base_dir(), os.path.expanduser("~"))


@functools.cache
def _executor_dirs(base: str, home: str) -> frozenset[str]:
    # Keyed by what the environment decides (TMPDIR, HOME): a warm daemon's call runs
    # under its client's, not the daemon's.
    uid = os.geteuid()
    paths = (
        base,
        f"/var/tmp/bash-sandbox-{uid}",
        f"/tmp/bash-sandbox-{uid}",
        os.path.join(home, ".cache", "bash-sandbox"),
    )
    return frozenset(os.path.realpath(p) for p in paths)


def find_dotgits(
    roots: tuple[str, ...], budget: int = DISCOVERY_BUDGET
) -> tuple[list[str], list[str]]:
    """Every `.git` entry (any kind) at or below ``roots``, never below a `.git`, and every
    bare repository (a directory git takes for a git directory, searched below too);
    breadth first, dependency directories after everything else; and the directories left
    unlisted when ``budget`` ran out (empty when the search was complete)."""
    now_ns = time.time_ns()
    skip = executor_dirs()
    found: list[str] = []
    first: deque[str] = deque(roots)
    last: deque[str] = deque()
    while first or last:
        if budget <= 0:
            return found, [*first, *last]
        budget -= 1
        from_first = bool(first)
        directory = first.popleft() if from_first else last.popleft()
        if directory in skip:
            continue
        listing = _list(directory, now_ns)
        if listing is None:
            continue
        if listing.bare:
            # Searched below too: host git run in a directory below it finds a `.git` there
            # first (a repository the command made inside a bare one is its to reset).
            found.append(directory)
        if listing.dotgit:
            found.append(directory.rstrip("/") + "/.git")
        # Below a dependency directory everything is searched last too.
        (first if from_first else last).extend(listing.subdirs)
        last.extend(listing.dependencies)
    return found, []


class DotGitSearch(Protocol):
    """`find_dotgits`, or an executor's watched tree answering the same (`git_tree_watch.py`)."""

    def __call__(
        self, roots: tuple[str, ...], budget: int = DISCOVERY_BUDGET
    ) -> tuple[list[str], list[str]]: ...


_BARE_NAMES = frozenset({"HEAD", "objects", "refs", "commondir"})
# git's `validate_headref`: `ref:`, any blanks, `refs/`; or an object id (SHA-1 or SHA-256,
# hex of either case; git reads no further than the id).
_HEAD = re.compile(rb"^(ref:\s*refs/|[0-9a-fA-F]{40})")


def is_git_directory(path: str) -> bool:
    """Whether git may take ``path`` for a git directory, as its `is_git_directory` does,
    erring towards yes: a `HEAD` that `validate_headref` accepts (a symbolic ref into
    `refs/`, with any blanks after `ref:`; an object id; a symlink, which git accepts when
    it points into `refs/`), and `objects` and `refs` in the directory or, with a
    `commondir` file, in the directory it names (taken as present: they can appear there
    later without this directory changing). A bare repository (`git init --bare x.git`) is
    one, named as it likes."""
    head = os.path.join(path, "HEAD")
    try:
        st = os.lstat(head)
        if stat.S_ISDIR(st.st_mode):
            return False
        if not (
            os.path.lexists(os.path.join(path, "commondir"))
            or (
                os.path.lexists(os.path.join(path, "objects"))
                and os.path.lexists(os.path.join(path, "refs"))
            )
        ):
            return False
        if not stat.S_ISREG(st.st_mode):
            return True  # a symlink (git reads its target), a fifo: taken as git's
        fd = os.open(head, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return _HEAD.match(os.read(fd, 256)) is not None
        finally:
            os.close(fd)
    except OSError:
        return False


def snapshot(path: str) -> DotGit:
    """A `.git` entry as it is now (a link's target, a gitfile's bytes, where they lead)."""
    found = _snapshot(path)
    if found.kind in ("link", "file"):
        return dataclasses.replace(found, target=_target(path))
    return found


def _snapshot(path: str) -> DotGit:
    try:
        st = os.lstat(path)
    except OSError:
        return DotGit(path, "other")
    if stat.S_ISLNK(st.st_mode):
        try:
            return DotGit(path, "link", os.fsencode(os.readlink(path)))
        except OSError:
            return DotGit(path, "link")
    if stat.S_ISDIR(st.st_mode):
        return DotGit(path, "dir")
    if stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return DotGit(path, "file")
        try:
            return DotGit(path, "file", os.read(fd, _GITFILE_MAX))
        finally:
            os.close(fd)
    return DotGit(path, "other")


def gitdirs_behind(dotgit: str, roots: tuple[str, ...]) -> list[str]:
    """The git directories a `.git` entry leads host git to, that a command could write.

    A directory is itself; a symlink is followed (git's `stat` follows it) to a directory
    or a gitfile. A gitfile's target is taken only inside a root, or when that directory
    points back at this very `.git` file the way git links them (a linked worktree's
    `gitdir`, a submodule's `core.worktree`); its common dir outside the roots only in
    git's own layout. Otherwise a command could name any host directory (`/`, the home) and
    have the copy-back write git state there. Outside the roots nothing needs an overlay:
    the command cannot write there."""
    try:
        st = os.stat(dotgit)  # follows a symlink, as git does
    except OSError:
        return []
    if stat.S_ISDIR(st.st_mode):
        real = resolved(dotgit)
        return [real] if real is not None and within_any(real, roots) else []
    if not stat.S_ISREG(st.st_mode):
        return []
    target = read_gitfile(dotgit)
    if target is None or not os.path.isdir(target):
        return []
    if not within_any(target, roots) and not _points_back(target, dotgit):
        return []
    found = [target]
    common = read_small_text(os.path.join(target, "commondir"))
    if common is not None:
        main = resolved(os.path.join(target, common.strip()))
        # Outside the roots, only git's own layout, read from a directory the command
        # cannot write: the worktree's directory is `<common>/worktrees/<name>`.
        layout = (
            main is not None
            and not within_any(target, roots)
            and os.path.dirname(target) == os.path.join(main, "worktrees")
        )
        if main is not None and os.path.isdir(main) and (within_any(main, roots) or layout):
            found.append(main)
    return found


def _points_back(gitdir: str, dotgit: str) -> bool:
    """Whether ``gitdir`` names ``dotgit``'s worktree as its own: a linked worktree's
    `gitdir` file holds the path of the `.git` file; a submodule's config holds
    `core.worktree`, relative to the git directory (read with git's parser)."""
    own = resolved(dotgit)
    if own is None:
        return False
    back = (read_small_text(os.path.join(gitdir, "gitdir")) or "").strip()
    if back and resolved(os.path.join(gitdir, back)) == own:
        return True
    value = git_config_get(os.path.join(gitdir, "config"), "core.worktree")
    return value is not None and resolved(os.path.join(gitdir, value)) == os.path.dirname(own)


# git reading a file it is given, with nothing of the host's or the repository's config
# that runs code: no system or global config, no hooks, no fsmonitor; the git itself, and
# the PATH of what it runs, never from the harness's PATH (`binaries.host_git`).
_SCRUBBED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "HOME": "/nonexistent",
    "LC_ALL": "C",
}
_SCRUBBED_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


def scrubbed_git() -> list[str]:
    """argv of host git without hooks or fsmonitor (see `scrubbed_git_env`)."""
    return [host_git(), *_SCRUBBED_OPTIONS]


def scrubbed_git_env(**extra: str) -> dict[str, str]:
    """The environment for `scrubbed_git`: no system or global config, ``extra`` added."""
    return {"PATH": host_git_path(), **_SCRUBBED_ENV, **extra}


def listed_pairs(listed: bytes) -> list[tuple[str, str | None]]:
    """The (key, value) pairs of `git config --list -z` output; None for a key without
    `=` (git's boolean true)."""
    pairs: list[tuple[str, str | None]] = []
    for record in listed.split(b"\0"):
        if not record:
            continue
        key, sep, value = record.partition(b"\n")
        pairs.append((os.fsdecode(key), os.fsdecode(value) if sep else None))
    return pairs


def git_config_get(path: str, key: str) -> str | None:
    """``key`` in the config file ``path`` as git reads it (no includes followed)."""
    try:
        done = run_bounded(
            [*scrubbed_git(), "config", "--file", path, "--no-includes", "--get", key],
            env=scrubbed_git_env(),
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return os.fsdecode(done.stdout.rstrip(b"\n"))


def discover_gitdirs(
    policy: SandboxPolicy,
    *,
    budget: int = DISCOVERY_BUDGET,
    known: tuple[str, ...] = (),
    search: DotGitSearch = find_dotgits,
) -> GitDiscovery:
    """Git directories whose control plane a command could reach through a writable root:
    behind every `.git` entry at any depth below a root (`gitdirs_behind`). ``known``:
    `.git` entries an earlier search of this executor found, looked at again whatever this
    search reaches (a command cannot hide a repository from later commands by flooding the
    search's budget)."""
    roots = policy.all_writable_roots()
    dotgits, unlisted = search(roots, budget)
    entries: dict[str, None] = dict.fromkeys(dotgits)
    entries.update(dict.fromkeys(d for d in known if within_any(d, roots)))
    found: dict[str, None] = {}
    for dotgit in entries:
        found.update(dict.fromkeys(gitdirs_behind(dotgit, roots)))
    # A git dir inside another one (a worktree's gitdir below the common dir, a submodule's
    # below .git/modules) is covered by the outer overlay.
    kept: list[str] = []
    for d in sorted(found, key=lambda p: (p.count("/"), p)):
        if not any(within(d, k) for k in kept):
            kept.append(d)
    return GitDiscovery(
        gitdirs=tuple(kept),
        unsearched=tuple(unlisted[:_NAMED_UNSEARCHED]),
        unsearched_total=len(unlisted),
        entries=tuple(snapshot(p) for p in entries),
        roots=roots,
    )


def index_gitlinks(index_path: str, git_dir: str) -> set[str]:
    """Paths of the gitlink (submodule) entries of the index at ``index_path``, read by
    git's own parser (every index version, v4's prefix compression included) as the
    repository at ``git_dir`` (the host's: its object format) reads it."""
    try:
        done = run_bounded(
            [*scrubbed_git(), "ls-files", "--stage", "-z"],
            env=scrubbed_git_env(GIT_INDEX_FILE=index_path, GIT_DIR=git_dir),
            cwd="/",
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    links: set[str] = set()
    for record in done.stdout.split(b"\0"):
        meta, _, path = record.partition(b"\t")
        if meta.startswith(b"160000 "):
            links.add(os.fsdecode(path))
    return links


@dataclass
class AfterCommand:
    """What `after_command` found: repositories the command made (``created``: git
    directories whose control plane must be reset), `.git` entries it changed and that were
    put back (``restored``), gitfiles or symlinks leading out of the roots that were
    removed (``removed``), new ones naming an overlaid git dir itself that were removed
    (``second_checkouts``), and why anything could not be done (``warnings``)."""

    created: list[str] = field(default_factory=list)
    created_dotgits: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    second_checkouts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def after_command(
    before: GitDiscovery,
    roots: tuple[str, ...],
    overlaid: tuple[str, ...],
    *,
    budget: int = DISCOVERY_BUDGET,
    search: DotGitSearch = find_dotgits,
    born_by_ns: int | None = None,
    host_since_ns: int | None = None,
    writable: tuple[str, ...] = (),
) -> AfterCommand:
    """Search ``roots`` again after a command: every `.git` entry that is new, or a `.git`
    symlink or gitfile that changed, is a repository host git would trust and the command
    controls. A changed one that was there before is put back; a new one's git directory
    is listed in ``created`` (unless it is one of the ``overlaid`` ones, whose writes never
    reached the host); a new one leading out of the roots is removed, and so is a new one
    naming an overlaid git dir itself (a second main checkout of it: the next survey would
    take its directory for that git dir's checkout, `git_import.main_checkout_inside`; a
    linked worktree's names `worktrees/<id>`, a submodule's `modules/<name>`, both kept). An
    unchanged link or gitfile is followed again: the directory it names may have become a
    repository during the command (named by an earlier one before it existed), and is then
    the command's. ``born_by_ns``: a new entry made after it (statx's birth time) is not the
    command's (a dead executor's command, settled later: `git_settle_record.py`).
    ``host_since_ns``: when the command started; a git dir born since outside the roots
    and outside everything else the command could write (``writable``: its tool cache home,
    its private TMPDIR) is the host's (a worktree the user added meanwhile)."""
    result = AfterCommand()
    dotgits, unlisted = search(roots, budget)
    if unlisted:
        result.warnings.append(
            "git: the search for repositories the command created stopped after "
            f"{budget} directories; not searched: {', '.join(unlisted[:_NAMED_UNSEARCHED])}"
        )
    previous = {e.path: e for e in before.entries}
    for path in dotgits:
        now = snapshot(path)
        old = previous.get(path)
        if old is None and born_by_ns is not None:
            born = birth_ns(path)
            if born is not None and born > born_by_ns:
                continue  # made after the command was gone: the user's
        changed = old is not None and (old.kind, old.content) != (now.kind, now.content)
        kinds = {now.kind, old.kind if old is not None else ""}
        if changed and old is not None and kinds <= {"link", "file"} and _put_back(old):
            result.restored.append(path)
            now = snapshot(path)  # as it was, but a link on its way may lead elsewhere
        same = old is not None and (old.kind, old.content) == (now.kind, now.content)
        # A link or gitfile whose bytes are the same may still lead elsewhere now: a link
        # on its way replaced, or its target made a repository (`gitdir: ../x` written by
        # one command while `x` did not exist, `x` by the next).
        moved = same and old is not None and old.target != now.target
        overlaid_target = now.target is not None and within_any(now.target, overlaid)
        if same and (now.kind == "dir" or overlaid_target) and not moved:
            continue  # there before and overlaid: the command's writes are in the upper
        if (not same or moved) and now.kind in ("link", "file") and now.target in overlaid:
            with contextlib.suppress(OSError):
                os.unlink(path)
                result.second_checkouts.append(path)
            continue
        behind = gitdirs_behind(path, roots)
        if not behind:
            if (
                (not same or moved)
                and now.kind in ("link", "file")
                and _leads_out(now.target, roots, overlaid)
            ):
                # Host git would follow it to a repository the user never chose.
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    result.removed.append(path)
            continue
        # Behind a link or a gitfile, only a directory git would take for a repository.
        fresh = [
            g
            for g in behind
            if not within_any(g, overlaid)
            and (now.kind == "dir" or os.path.lexists(os.path.join(g, "HEAD")))
        ]
        outside = [g for g in fresh if not within_any(g, roots)]
        if (
            host_since_ns is not None
            and (not same or moved)
            and outside
            and not any(within_any(g, writable) for g in outside)
            and any((born := birth_ns(g)) is not None and born > host_since_ns for g in outside)
        ):
            continue  # the host made it while the command ran (`git worktree add` into a root)
        if (not same or moved) and now.kind in ("link", "file") and outside:
            # A new one naming a git dir outside the roots (a removed linked worktree's
            # checkout written back: `gitdir` still names it) is not the command's
            # repository: resetting it wrote the host's own, outside every root (a red team's).
            with contextlib.suppress(OSError):
                os.unlink(path)
                result.removed.append(path)
            continue
        if fresh:
            result.created_dotgits.append(path)
            result.created += [g for g in fresh if g not in result.created]
    # A linked worktree's or a submodule's git dir inside a created one is reset with it;
    # any other repository below one (`x.git/sub/.git`) is reset on its own.
    kept: list[str] = []
    for d in sorted(result.created, key=lambda p: (p.count("/"), p)):
        inner = (os.path.join(k, sub) for k in kept for sub in ("worktrees", "modules"))
        if not any(within(d, i) for i in inner):
            kept.append(d)
    result.created = kept
    return result


def _target(dotgit: str) -> str | None:
    """Where a `.git` link or gitfile leads, resolved (None: a gitfile git cannot read)."""
    return resolved(dotgit) if os.path.islink(dotgit) else read_gitfile(dotgit)


def _leads_out(target: str | None, roots: tuple[str, ...], overlaid: tuple[str, ...]) -> bool:
    """Whether a `.git` link or gitfile leading to ``target`` (its `DotGit.target`) leads
    out of the roots, to somewhere other than an overlaid git dir (a submodule's git dir
    there appears on the host with the copy-back)."""
    return target is not None and not within_any(target, (*roots, *overlaid))


def _put_back(old: DotGit) -> bool:
    """Restore a `.git` symlink or gitfile as it was (by rename, never through a link)."""
    if old.content is None:
        return False
    directory, name = os.path.split(old.path)
    tmp = f".{name}.bash-sandbox-{os.getpid()}"
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        if old.kind == "link":
            os.symlink(old.content, tmp, dir_fd=dir_fd)
        else:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dir_fd,
            )
            try:
                os.write(fd, old.content)
            finally:
                os.close(fd)
        # A directory the command put there instead is not replaced: it is a new repository.
        if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
            os.unlink(tmp, dir_fd=dir_fd)
            return False
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        return False
    finally:
        os.close(dir_fd)
