"""Which paths get a read-only mount on top of the writable roots, shared by bwrap and Landlock.

Semantics: protected names win over the writable root they sit in, also when they do not
exist yet (the first missing component gets a read-only empty directory, so nothing can be
created under it) or are symlinks (the link's target is protected); every directory between
the root and a protected name is bound onto itself (still writable) so it is a mount point
that cannot be renamed or removed (otherwise `mv .git .git-old; mkdir -p .git/hooks` would
plant a hook); `deny_read` paths are covered by an unreadable (mode 000) empty file or
directory. `inspect_*` look at the host;
`render_mount_plan` is pure so its output can be asserted exactly.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

from policies import SandboxPolicy

MountKind = Literal["pin", "protect-existing", "protect-missing", "hide-dir", "hide-file"]


@dataclass(frozen=True)
class PathTarget:
    """A host path to cover, as found on the host when the command is about to start."""

    path: str
    kind: MountKind


@dataclass(frozen=True)
class PlannedMount:
    """Bind ``source`` over ``target``; ``create``: the target is a placeholder to make first.

    ``read_only=False`` only for pins: a directory bound onto itself to make it a mount point.
    """

    source: str
    target: str
    create: bool = False
    read_only: bool = True


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
            lexical = os.path.join(root, name)
            resolved = os.path.realpath(lexical)
            # The names leading to it stay put even when it is a symlink to elsewhere.
            targets += _pins_between(root, lexical)
            if not _within(resolved, roots):
                continue  # already read-only: it lies outside every writable root
            owner = next(r for r in roots if _within(resolved, (r,)))
            missing = _first_missing(resolved, owner)
            target = resolved if missing is None else missing
            targets += _pins_between(owner, target)
            if missing is None:
                targets.append(PathTarget(resolved, "protect-existing"))
            else:
                targets.append(PathTarget(missing, "protect-missing"))
    return tuple(targets)


def symlinked_protected_paths(policy: SandboxPolicy) -> tuple[str, ...]:
    """Protected names that are (or sit under) a symlink inside a writable root.

    Their target is protected, but the link itself cannot be mounted over, so a command could
    unlink it and create a real directory in its place: enforcement is only partial.
    """
    found: list[str] = []
    for root in policy.all_writable_roots():
        for name in policy.protected_paths:
            cur = root
            for part in name.split("/"):
                cur = os.path.join(cur, part)
                if os.path.islink(cur):
                    found.append(cur)
                    break
    return tuple(found)


def _pins_between(root: str, target: str) -> list[PathTarget]:
    """Existing directories strictly between ``root`` and ``target``."""
    pins: list[PathTarget] = []
    cur = root
    for part in os.path.relpath(target, root).split("/")[:-1]:
        cur = os.path.join(cur, part)
        if os.path.isdir(cur) and not os.path.islink(cur):
            pins.append(PathTarget(cur, "pin"))
    return pins


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
) -> tuple[PlannedMount, ...]:
    """Mounts in the order they must be applied: pins, protections, then hidden paths.

    Pins come first (shallowest first) because a later mount on an ancestor would cover the
    protections beneath it; hidden paths come last so a denied path inside a writable root
    stays unreadable.
    """
    guards = _drop_nested([t for t in protected if t.kind != "pin"])
    pins = sorted(
        {
            t.path
            for t in protected
            if t.kind == "pin" and not any(_within(t.path, (g.path,)) for g in guards)
        },
        key=lambda p: (p.count("/"), p),
    )
    mounts = [PlannedMount(p, p, read_only=False) for p in pins]
    for t in guards:
        if t.kind == "protect-existing":
            mounts.append(PlannedMount(t.path, t.path))
        else:
            mounts.append(PlannedMount(sources.empty_dir, t.path, create=True))
    for t in _drop_nested(list(hidden)):
        source = sources.deny_dir if t.kind == "hide-dir" else sources.deny_file
        mounts.append(PlannedMount(source, t.path))
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
    os.chmod(sources.empty_dir, 0o555)  # noqa: S103 - an empty, read-only mount source
    os.chmod(sources.deny_dir, 0o000)
    os.chmod(sources.deny_file, 0o000)
    return sources


def plan_mounts(
    policy: SandboxPolicy, hidden_paths: tuple[str, ...], sources: PlaceholderSources
) -> tuple[PlannedMount, ...]:
    """Inspect the host now and render the mounts for one spawn (both Linux backends)."""
    return render_mount_plan(
        inspect_protected(policy),
        inspect_deny_read((*policy.deny_read, *hidden_paths)),
        sources,
    )
