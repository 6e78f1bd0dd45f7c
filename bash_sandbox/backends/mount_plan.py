"""Which paths get a read-only mount on top of the writable roots, shared by bwrap and Landlock.

Semantics: protected names win over the writable root they sit in, also when they do not
exist yet (the first missing component gets a read-only empty directory, so nothing can be
created under it) or are symlinks (the link's target is protected); `deny_read` paths are
covered by an unreadable (mode 000) empty file or directory. `inspect_*` look at the host;
`render_mount_plan` is pure so its output can be asserted exactly.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

from policies import SandboxPolicy

MountKind = Literal["protect-existing", "protect-missing", "hide-dir", "hide-file"]


@dataclass(frozen=True)
class PathTarget:
    """A host path to cover, as found on the host when the command is about to start."""

    path: str
    kind: MountKind


@dataclass(frozen=True)
class ReadOnlyMount:
    """Bind ``source`` read-only over ``target``; ``create`` means the target is a placeholder."""

    source: str
    target: str
    create: bool = False


@dataclass(frozen=True)
class PlaceholderSources:
    """Per-executor private sources: an empty dir (0555) and unreadable dir/file (0000)."""

    empty_dir: str
    deny_dir: str
    deny_file: str


def _within(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _first_missing(path: str, root: str) -> str | None:
    """The shallowest component of ``path`` below ``root`` that does not exist, if any."""
    rel = os.path.relpath(path, root)
    cur = root
    for part in rel.split("/"):
        cur = os.path.join(cur, part)
        if not os.path.lexists(cur):
            return cur
    return None


def inspect_protected(policy: SandboxPolicy) -> tuple[PathTarget, ...]:
    """Protected names under every writable root, resolved on the host right now."""
    roots = policy.all_writable_roots()
    targets: list[PathTarget] = []
    for root in roots:
        for name in policy.protected_paths:
            # realpath also resolves a dangling final symlink: writing through the link would
            # create its target, so the target is what must stay read-only.
            resolved = os.path.realpath(os.path.join(root, name))
            if not _within(resolved, roots):
                continue  # already read-only: it lies outside every writable root
            owner = next(r for r in roots if _within(resolved, (r,)))
            missing = _first_missing(resolved, owner)
            if missing is None:
                targets.append(PathTarget(resolved, "protect-existing"))
            else:
                targets.append(PathTarget(missing, "protect-missing"))
    return tuple(targets)


def inspect_deny_read(paths: tuple[str, ...]) -> tuple[PathTarget, ...]:
    """Existing denied paths (and their symlink targets); missing ones have nothing to read."""
    targets: list[PathTarget] = []
    for p in paths:
        for candidate in dict.fromkeys((p, os.path.realpath(p))):
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            kind: MountKind = "hide-dir" if stat.S_ISDIR(st.st_mode) else "hide-file"
            targets.append(PathTarget(os.path.realpath(candidate), kind))
    return tuple(targets)


def _drop_nested(targets: list[PathTarget]) -> list[PathTarget]:
    """Keep the first target per path and drop targets beneath an earlier-kept one."""
    kept: list[PathTarget] = []
    for t in sorted(dict.fromkeys(targets), key=lambda t: (t.path.count("/"), t.path)):
        if not any(_within(t.path, (k.path,)) for k in kept):
            kept.append(t)
    return kept


def render_mount_plan(
    protected: tuple[PathTarget, ...],
    hidden: tuple[PathTarget, ...],
    sources: PlaceholderSources,
) -> tuple[ReadOnlyMount, ...]:
    """Read-only mounts in the order they must be applied: protections, then hidden paths.

    Hidden paths come last so a denied path inside a writable root stays unreadable.
    """
    mounts: list[ReadOnlyMount] = []
    for t in _drop_nested(list(protected)):
        if t.kind == "protect-existing":
            mounts.append(ReadOnlyMount(t.path, t.path))
        else:
            mounts.append(ReadOnlyMount(sources.empty_dir, t.path, create=True))
    for t in _drop_nested(list(hidden)):
        source = sources.deny_dir if t.kind == "hide-dir" else sources.deny_file
        mounts.append(ReadOnlyMount(source, t.path))
    return tuple(mounts)


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
    os.chmod(sources.empty_dir, 0o555)
    os.chmod(sources.deny_dir, 0o000)
    os.chmod(sources.deny_file, 0o000)
    return sources
