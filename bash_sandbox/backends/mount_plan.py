"""The filesystem view of a confined command, as an ordered list of mount operations.

Both Linux backends apply the same plan as child steps (`view_steps.py`; only bwrap's probe
renders it as bwrap arguments), on their shared base: the host read-only, nosuid and nodev,
a fresh `/dev`, a `/proc` of the command's PID namespace. Semantics, and why each step comes
where it does:

1. **Private `/tmp`** (both modes): the executor's tmpfs. Roots under the host's `/tmp` get
   their top-level entry bound back read-only, so the workspace stays visible there. First,
   so that everything below refines it.
2. **Shadows.** Each directory that directly holds a `deny_read` path outside the writable
   roots (`~` for `~/.netrc`) is replaced by a read-only tmpfs holding the directory's other
   entries, bound back one by one, and an unreadable placeholder for each denied entry that
   exists. A name the host creates or replaces later (an atomic rewrite of
   `~/.git-credentials`, a `~/.pgpass` that did not exist) never appears in a running
   command: the command sees the directory as it was when it started. Shallow first, so a
   deeper shadow (`~/.config` for `~/.config/gh`) refines the shallower one.
3. **Writable roots** (workspace-write), bound writable; they come after the shadows, so a
   workspace under a shadowed home stays writable. Then the pins (below), before the
   overlays, since a pinned directory may lead to a nested repository's git directory.
4. **Git overlays**: each git directory in a writable root (also one nested up to three
   levels below it) is an overlay whose upper layer
   is private to the command; the executor merges back what git needs to commit, branch,
   stash, rebase and fetch, and discards the rest (`git_plane.py`). An overlay is a mount,
   so nothing renames it away and no rename or link crosses into it.
5. **Protected names** inside the roots, after the roots they sit in so they win: an existing
   name is bound read-only onto itself; a missing one gets a placeholder (inside a git
   overlay's private upper layer, or a refcounted host placeholder of the right kind) bound
   read-only; the directories leading to a protected name are pinned (bound onto themselves)
   so they cannot be renamed away.
6. **Denied paths inside the roots** and the executor-private paths, covered last.

A name covered where it lies (steps 5 and 6, and denied paths in system or large
directories) is a mount on a dentry, which the host's rename or delete detaches: the
executor watches those names while the command runs (`linux/cover_watch.py`).

`inspect_*` look at the host; `render_mount_plan` is pure so its output can be asserted exactly.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from bash_sandbox.view import (
    EntryKind,
    GitOverlay,
    HostView,
    MountOp,
    MountOpKind,
    PlaceholderSources,
    Shadow,
    ShadowEntry,
)
from policies import SandboxPolicy
from policies.autorun import FILE_ONLY_PATHS, directory_placeholder, needs_placeholder
from policies.paths import within, within_any

__all__ = [
    "EntryKind",
    "GitOverlay",
    "HostView",
    "MountOp",
    "MountOpKind",
    "PlaceholderSources",
    "Shadow",
    "ShadowEntry",
    "within",
    "within_any",
]

# Directories with this many entries are covered entry by entry instead of shadowed.
MAX_SHADOW_ENTRIES = 512
# System directories are never shadowed: their credentials are covered where they lie.
UNSHADOWED = frozenset({"/", "/etc", "/usr", "/var", "/proc", "/sys", "/dev", "/run", "/tmp"})
# Names inside a git directory that are directories when they exist (placeholders follow).
GIT_DIRECTORY_NAMES = frozenset({"hooks", "info", "modules", "worktrees", "objects", "refs"})


def render_mount_plan(
    policy: SandboxPolicy,
    view: HostView,
    sources: PlaceholderSources,
    *,
    private_tmp: str | None,
) -> tuple[MountOp, ...]:
    """The ordered operations (see the module docstring). Pure."""
    ops: list[MountOp] = []
    # The private /tmp first: a shadow below /tmp (a workspace's sibling secret, a home
    # under /tmp) must sit on top of the entry bound back, never under the private /tmp.
    if private_tmp is not None:
        ops.append(MountOp("bind", "/tmp", private_tmp, writable=True))
        for top in view.tmp_tops:
            ops += [MountOp("mkdir", top), MountOp("bind", top, top)]
    for shadow in sorted(view.shadows, key=lambda s: (s.directory.count("/"), s.directory)):
        ops.append(MountOp("tmpfs", shadow.directory))
        for entry in shadow.entries:
            path = os.path.join(shadow.directory, entry.name)
            if entry.kind == "symlink":
                ops.append(MountOp("symlink", path, entry.link))
            elif entry.kind == "denied-dir":
                ops += [MountOp("mkdir", path), MountOp("bind", path, sources.deny_dir)]
            elif entry.kind == "denied-file":
                ops += [MountOp("mkfile", path), MountOp("bind", path, sources.deny_file)]
            else:
                ops += [
                    MountOp("mkdir" if entry.kind == "dir" else "mkfile", path),
                    MountOp("bind", path, path, optional=True),
                ]
        ops.append(MountOp("readonly", shadow.directory))
    ops += [MountOp("bind", root, root, writable=True) for root in policy.all_writable_roots()]
    # Pins before overlays: a pinned directory may lead to a nested repository's git dir,
    # whose overlay must sit on top of the pin, not under it.
    ops += [MountOp("bind", p, p, writable=True) for p in view.pins]
    for o in view.overlays:
        ops.append(
            MountOp("overlay", o.gitdir, o.gitdir, writable=True, upper=o.upper, work=o.work)
        )
        if not within_any(o.gitdir, policy.all_writable_roots()):
            # A linked worktree's git dir outside the roots: the read-only base covers the
            # overlay mounted there, so it is bound back writable (writes stay in its upper).
            ops.append(MountOp("bind", o.gitdir, o.gitdir, writable=True))
    ops += [MountOp("bind", p, p) for p in view.protect]
    ops += [MountOp("bind", target, source, writable=True) for target, source in view.file_binds]
    # The executors' own private directories (another executor's spill dir): one removed
    # before the mount (that executor closed) has nothing left to hide, so its cover is
    # skipped rather than failing the spawn. The user's deny_read covers are never skipped.
    hidden = frozenset(view.hidden)
    ops += [MountOp("bind", p, sources.deny_dir, optional=p in hidden) for p in view.deny_dirs]
    ops += [MountOp("bind", p, sources.deny_file) for p in view.deny_files]
    return tuple(ops)


# -- inspecting the host -------------------------------------------------------------------


def tmp_tops(paths: Iterable[str]) -> tuple[str, ...]:
    """`/tmp/<first>` for every path strictly below /tmp, deduplicated, in order."""
    tops: dict[str, None] = {}
    for path in paths:
        parts = path.split("/")
        if len(parts) > 2 and parts[1] == "tmp" and parts[2]:
            tops.setdefault("/tmp/" + parts[2], None)
    return tuple(tops)


def visible(path: str, tops: tuple[str, ...], private_tmp: bool) -> bool:
    """Whether ``path`` is reachable in the view: the private /tmp hides the host's, except
    the top-level entries bound back."""
    if not private_tmp or not within(path, "/tmp"):
        return True
    return within_any(path, tops)


def _nearest_existing(path: str) -> str:
    while not os.path.isdir(path) and path != "/":
        path = os.path.dirname(path)
    return path


def _entry(path: str, name: str, denied: frozenset[str]) -> ShadowEntry:
    full = os.path.join(path, name)
    st = os.lstat(full)
    if full in denied or os.path.realpath(full) in denied:
        try:
            target_is_dir = stat.S_ISDIR(os.stat(full).st_mode)
        except OSError:
            target_is_dir = stat.S_ISDIR(st.st_mode)
        return ShadowEntry(name, "denied-dir" if target_is_dir else "denied-file")
    if stat.S_ISLNK(st.st_mode):
        return ShadowEntry(name, "symlink", os.readlink(full))
    return ShadowEntry(name, "dir" if stat.S_ISDIR(st.st_mode) else "file")


@dataclass(frozen=True)
class ShadowSurvey:
    """What `inspect_shadows` read from the host: the shadows with their listings, the
    denied names to cover where they lie (if they exist), every path it resolved (each
    component of each denied name, through every link) and every directory whose entries
    it read (`shadow_cache` reuses a survey while none of them changed)."""

    shadows: tuple[Shadow, ...]
    candidates: tuple[str, ...]
    resolved: tuple[str, ...]
    listed: tuple[str, ...]


def _resolution_paths(path: str, limit: int = 40) -> list[str]:
    """Every path `os.path.realpath(path)` looks at: each component's prefix, through
    every symlink it follows (``limit`` hops, like ELOOP)."""
    seen: list[str] = []
    pending = [os.path.normpath(path)]
    while pending and limit > 0:
        limit -= 1
        probe = "/"
        for part in pending.pop().strip("/").split("/"):
            probe = os.path.join(probe, part)
            seen.append(probe)
            try:
                link = os.readlink(probe)
            except OSError:
                continue  # not a link, or missing
            pending.append(os.path.normpath(os.path.join(os.path.dirname(probe), link)))
    return seen


def survey_shadows(denied: Iterable[str], roots: tuple[str, ...]) -> ShadowSurvey:
    """The shadows of the directories holding ``denied`` paths, and the names to cover
    instead: a denied path inside a writable root, or one whose directory is a system
    directory or too large, is covered where it lies."""
    names: set[str] = set()
    for p in denied:
        names.add(os.path.normpath(p))
        names.add(os.path.realpath(p))
    frozen = frozenset(names)
    resolved: dict[str, None] = {}
    listed: dict[str, None] = {}
    parents: dict[str, None] = {}
    candidates: list[str] = []
    for path in sorted(frozen):
        resolved.update(dict.fromkeys(_resolution_paths(path)))
        # The real directory: a tmpfs mounted through a link (`~/.cache` -> elsewhere) lands
        # on its target, over that target's own shadow, and its entries come back empty.
        parent = os.path.realpath(_nearest_existing(os.path.dirname(path)))
        inside = within_any(path, roots) or within_any(parent, roots)
        if not inside and parent not in UNSHADOWED and not any(within(r, path) for r in roots):
            listed.setdefault(parent, None)
            try:
                count = sum(1 for _ in os.scandir(parent))
            except OSError:
                count = MAX_SHADOW_ENTRIES + 1
            if count <= MAX_SHADOW_ENTRIES:
                parents.setdefault(parent, None)
                continue
        candidates.append(path)
    shadows = []
    for parent in parents:
        try:
            listing = sorted(os.listdir(parent))
        except OSError:
            continue
        entries = []
        for name in listing:
            try:
                entry = _entry(parent, name, frozen)
            except OSError:
                continue  # vanished meanwhile
            if entry.kind not in {"dir", "file"}:
                # Its kind depends on where the link leads: those paths count too.
                resolved.update(dict.fromkeys(_resolution_paths(f"{parent}/{name}")))
            entries.append(entry)
        shadows.append(Shadow(parent, tuple(entries)))
    return ShadowSurvey(tuple(shadows), tuple(candidates), tuple(resolved), tuple(listed))


def cover_candidates(
    survey: ShadowSurvey,
) -> tuple[tuple[Shadow, ...], tuple[str, ...], tuple[str, ...]]:
    """(shadows, dirs to cover, files to cover): the survey's shadows, and its candidates
    as they exist now (looked at on every spawn, never cached: a secret made since the
    survey is covered)."""
    cover_dirs: list[str] = []
    cover_files: list[str] = []
    for path in survey.candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue  # missing and not shadowable: nothing to read now
        (cover_dirs if stat.S_ISDIR(st.st_mode) else cover_files).append(os.path.realpath(path))
    shadows = survey.shadows
    # A denied path at or below a shadow's denied entry is already hidden there. Anything
    # else below a shadowed directory is not: its other entries are bound back, and a root
    # among them is bound writable (`D/link -> ws/sec` denied, the workspace `D/ws`).
    hidden = _shadow_denied(shadows)
    covered = [p for p in cover_dirs if not _below_any(p, hidden)]
    files = [p for p in cover_files if not _below_any(p, hidden)]
    return shadows, _drop_nested(covered), _drop_nested(files)


def _shadow_denied(shadows: tuple[Shadow, ...]) -> frozenset[str]:
    """The paths the shadows replace by an unreadable placeholder."""
    return frozenset(
        os.path.join(s.directory, e.name)
        for s in shadows
        for e in s.entries
        if e.kind in ("denied-dir", "denied-file")
    )


def _below_any(path: str, tops: frozenset[str]) -> bool:
    """Whether ``path`` is one of ``tops`` or lies below one."""
    return bool(tops) and any(p in tops for p in _prefixes(path))


def inspect_shadows(
    denied: Iterable[str], roots: tuple[str, ...]
) -> tuple[tuple[Shadow, ...], tuple[str, ...], tuple[str, ...]]:
    """(shadows, dirs to cover, files to cover) for the denied paths, as the host has them."""
    return cover_candidates(survey_shadows(denied, roots))


def _drop_nested(paths: list[str]) -> tuple[str, ...]:
    kept: list[str] = []
    for p in sorted(dict.fromkeys(paths), key=lambda p: (p.count("/"), p)):
        if not any(within(p, k) for k in kept):
            kept.append(p)
    return tuple(kept)


class _Looks:
    """lstat answers for one survey: the protected names share their leading directories,
    and each was looked at up to five times (about 580 lstat calls a spawn)."""

    def __init__(self) -> None:
        self._seen: dict[str, int | None] = {}  # path -> st_mode, None when missing

    def mode(self, path: str) -> int | None:
        if path not in self._seen:
            try:
                self._seen[path] = os.lstat(path).st_mode
            except OSError:
                self._seen[path] = None
        return self._seen[path]

    def exists(self, path: str) -> bool:
        return self.mode(path) is not None

    def kinds(self) -> tuple[tuple[str, int | None], ...]:
        """Each path looked at and its kind (`_kind`), None where missing."""
        return tuple(
            (path, None if mode is None else stat.S_IFMT(mode)) for path, mode in self._seen.items()
        )

    def is_link(self, path: str) -> bool:
        mode = self.mode(path)
        return mode is not None and stat.S_ISLNK(mode)

    def is_real_dir(self, path: str) -> bool:
        """A directory, not a link to one (`isdir and not islink`)."""
        mode = self.mode(path)
        return mode is not None and stat.S_ISDIR(mode)


def _parts_below(path: str, root: str) -> list[str]:
    """`os.path.relpath(path, root).split("/")`, by slicing where ``path`` lies below the
    canonical ``root`` (about 80 of these per workspace-write spawn: relpath's two abspaths
    and common prefix are most of the protected names' inspection)."""
    path = os.path.normpath(path)
    prefix = root if root.endswith("/") else root + "/"
    if path.startswith(prefix) and len(path) > len(prefix):
        return path[len(prefix) :].split("/")
    return os.path.relpath(path, root).split("/")


def _first_missing(path: str, root: str, looks: _Looks | None = None) -> str | None:
    """The shallowest component of ``path`` below ``root`` that does not exist, if any."""
    looks = looks or _Looks()
    cur = root
    for part in _parts_below(path, root):
        cur = os.path.join(cur, part)
        if not looks.exists(cur):
            return cur
    return None


def _pins_between(root: str, target: str, looks: _Looks | None = None) -> list[str]:
    """Existing real directories strictly between ``root`` and ``target``."""
    looks = looks or _Looks()
    pins: list[str] = []
    cur = root
    for part in _parts_below(target, root)[:-1]:
        cur = os.path.join(cur, part)
        if looks.is_real_dir(cur):
            pins.append(cur)
    return pins


@dataclass(frozen=True)
class ProtectedView:
    """Protected names found on the host for one spawn."""

    protect: tuple[str, ...]  # existing paths to bind read-only onto themselves
    pins: tuple[str, ...]
    missing: tuple[tuple[str, bool], ...]  # (path, is_dir) needing a host placeholder
    in_git: tuple[tuple[str, str, bool], ...]  # (gitdir, name inside it, is_dir) to cover
    symlinked: tuple[str, ...]


# inspect_protected's last answers, each with the lstat kind of every path it looked at.
_MemoKey = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], str]
_MEMO: dict[_MemoKey, tuple[tuple[tuple[str, int | None], ...], ProtectedView]] = {}
_MEMO_MAX = 16


def _prefixes(path: str) -> list[str]:
    """``path`` and each of its ancestors but `/`."""
    found = []
    while path not in ("/", ""):
        found.append(path)
        path = os.path.dirname(path)
    return found


def _kind(path: str) -> int | None:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except OSError:
        return None


def inspect_protected(policy: SandboxPolicy, gitdirs: tuple[str, ...]) -> ProtectedView:
    """Protected names under every writable root and every overlaid git directory.

    The answer depends only on what kind of entry (or none) each path it looked at is, where
    no name or root led through a link (then it resolved them): kept with those kinds and
    checked again with one lstat each, not rebuilt (80 names a workspace-write spawn, most
    of it path arithmetic)."""
    key = (
        policy.all_writable_roots(),
        tuple(policy.protected_paths),
        gitdirs,
        os.environ.get("HOME", ""),  # where a shell start-up file needs a placeholder
    )
    kept = _MEMO.get(key)
    if kept is not None and all(_kind(path) == kind for path, kind in kept[0]):
        return kept[1]
    looks = _Looks()
    view, resolved = _inspect_protected(policy, gitdirs, looks)
    if not resolved:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = (looks.kinds(), view)
    return view


def _inspect_protected(
    policy: SandboxPolicy, gitdirs: tuple[str, ...], looks: _Looks
) -> tuple[ProtectedView, bool]:
    """`inspect_protected`, and whether it resolved a link (its answer is then not kept)."""
    roots = policy.all_writable_roots()
    resolved_any = False
    protect: list[str] = []
    pins: list[str] = []
    missing: list[tuple[str, bool]] = []
    in_git: list[tuple[str, str, bool]] = []
    symlinked: list[str] = []
    git_names = {"config", "hooks"} | {
        p.removeprefix(".git/") for p in policy.protected_paths if p.startswith(".git/")
    }
    for gitdir in gitdirs:
        for name in sorted(git_names):
            in_git.append((gitdir, name, name.split("/")[0] in GIT_DIRECTORY_NAMES))
        # A nested repository's directories are pinned: renaming one would carry the
        # overlay away and leave a plain `.git` for the command to create at the old path.
        owner = next((r for r in roots if within(gitdir, r)), None)
        if owner is not None:
            pins += _pins_between(owner, gitdir, looks)
    for root in roots:
        real_root = os.path.realpath(root)
        root_is_real = real_root == root
        resolved_any |= not root_is_real
        for prefix in _prefixes(root):
            looks.mode(prefix)  # a kept answer holds while no component became a link
        for name in policy.protected_paths:
            lexical = os.path.join(root, name)
            if name == ".git" or name.startswith(".git/"):
                continue  # the overlay holds the git control plane (and its covers)
            linked = False
            cur = root
            for part in name.split("/"):
                cur = os.path.join(cur, part)
                if looks.is_link(cur):
                    symlinked.append(cur)
                    linked = True
                    break
            # No link below a real root: the name is already its own real path.
            plain = root_is_real and not linked and ".." not in name.split("/")
            resolved = os.path.normpath(lexical) if plain else os.path.realpath(lexical)
            resolved_any |= not plain
            pins += _pins_between(root, lexical, looks)
            if not within_any(resolved, roots) or within_any(resolved, gitdirs):
                continue  # read-only already, or inside an overlay
            owner = next(r for r in roots if within(resolved, r))
            first = _first_missing(resolved, owner, looks)
            pins += _pins_between(owner, resolved if first is None else first, looks)
            if first is None:
                if name not in FILE_ONLY_PATHS or not looks.is_real_dir(resolved):
                    protect.append(resolved)
            elif not looks.is_real_dir(os.path.dirname(first)):
                # Below a file nothing can be made (a secondary Jujutsu workspace's
                # `.jj/repo` file, where the main one has the config dir): no placeholder,
                # whose mount failed every spawn there (ENOTDIR).
                continue
            elif needs_placeholder(name, root, real_root=real_root):
                # An auto-run name is held by a directory: git never shows an empty one.
                is_dir = first != resolved or name.endswith("/") or directory_placeholder(name)
                missing.append((first, is_dir))
    view = ProtectedView(
        protect=tuple(dict.fromkeys(protect)),
        pins=tuple(dict.fromkeys(p for p in pins if not within_any(p, gitdirs))),
        missing=tuple(dict.fromkeys(missing)),
        in_git=tuple(in_git),
        symlinked=tuple(dict.fromkeys(symlinked)),
    )
    return view, resolved_any


def make_placeholder_sources(state_dir: str) -> PlaceholderSources:
    """Create the placeholder sources once per executor inside its private 0700 state dir."""
    sources = PlaceholderSources(
        empty_dir=os.path.join(state_dir, "empty"),
        deny_dir=os.path.join(state_dir, "denied-dir"),
        deny_file=os.path.join(state_dir, "denied-file"),
    )
    os.mkdir(sources.empty_dir, 0o555)
    os.mkdir(sources.deny_dir, 0o000)
    fd = os.open(sources.deny_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o000)
    os.close(fd)
    # mkdir honours umask; the modes are part of the protection, so set them exactly.
    os.chmod(sources.empty_dir, 0o555)  # noqa: S103 - an empty, read-only mount source
    os.chmod(sources.deny_dir, 0o000)
    os.chmod(sources.deny_file, 0o000)
    return sources
