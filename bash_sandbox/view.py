"""The plain vocabulary of a confined command's view of the host, below every module that
surveys the host (`host_view.py`), renders the view (`backends/mount_plan.py`) or imports git
state back (`git_plane.py`). Data only: nothing here looks at the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

MountOpKind = Literal["bind", "tmpfs", "symlink", "mkdir", "mkfile", "readonly", "overlay"]
EntryKind = Literal["dir", "file", "symlink", "denied-dir", "denied-file"]


@dataclass(frozen=True)
class MountOp:
    """One step of the view. ``source`` is a host path (binds), a link text (symlinks) or
    the lower directory (overlays); ``upper``/``work`` only for overlays."""

    kind: MountOpKind
    target: str
    source: str | None = None
    writable: bool = False
    upper: str | None = None
    work: str | None = None
    # A shadow's entry may vanish between listing and mounting: then it is simply absent.
    optional: bool = False


@dataclass(frozen=True)
class PlaceholderSources:
    """Per-executor private sources: an empty dir (0555) and unreadable dir/file (0000)."""

    empty_dir: str
    deny_dir: str
    deny_file: str


@dataclass(frozen=True)
class ShadowEntry:
    name: str
    kind: EntryKind
    link: str | None = None  # the symlink's text


@dataclass(frozen=True)
class Shadow:
    """A directory replaced by a tmpfs with these entries."""

    directory: str
    entries: tuple[ShadowEntry, ...]


@dataclass(frozen=True)
class GitOverlay:
    """A git directory mounted as an overlay; ``placeholders`` were made in ``upper``."""

    gitdir: str
    upper: str
    work: str
    placeholders: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostView:
    """What the host looks like for one spawn: everything the pure renderer needs."""

    shadows: tuple[Shadow, ...] = ()
    tmp_tops: tuple[str, ...] = ()
    overlays: tuple[GitOverlay, ...] = ()
    pins: tuple[str, ...] = ()
    protect: tuple[str, ...] = ()  # existing paths (or placeholders) to bind read-only
    deny_dirs: tuple[str, ...] = ()  # covered by the unreadable dir
    deny_files: tuple[str, ...] = ()  # covered by the unreadable file
    hidden: tuple[str, ...] = ()  # executor-private paths (Landlock alone hides them by rules)
    # (target, source): a file of the executor's, made for this spawn, bound over a git
    # dir's file (writable: what the command writes there stays in that file).
    file_binds: tuple[tuple[str, str], ...] = ()
    partial: tuple[str, ...] = field(default=(), compare=False)  # why enforcement is partial
    # Names covered where they lie (or missing there): a host change ends their cover.
    watched: tuple[str, ...] = field(default=(), compare=False)
    # (root, path, target): links in a root a host name leads through, put back after.
    links: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)
    # The placeholders this spawn holds for names missing when it looked (not the user's).
    placeholders: tuple[str, ...] = field(default=(), compare=False)
