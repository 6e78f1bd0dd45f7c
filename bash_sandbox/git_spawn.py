"""The git side of one confined spawn, before and after the command.

Before (`inspect_git`): the repositories the writable roots reach (`git_discovery.py`),
each to be overlaid, and the workspace files their installed hooks run
(`git_hook_chain.py`), to be covered read-only with the reason a refusal reports.
After (`settle_git`): repositories the command created get git's default control plane
(`git_created.py`), changed `.git` links and gitfiles are put back, and the gitlinks the
command added to an index are reported. The executor calls these two; the copy-back of the
overlays themselves is `git_plane.py`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bash_sandbox.git_created import reset_control_plane
from bash_sandbox.git_discovery import (
    DotGit,
    DotGitSearch,
    GitDiscovery,
    after_command,
    discover_gitdirs,
    find_dotgits,
    index_gitlinks,
    worktrees_of,
)
from bash_sandbox.git_hook_chain import ChainLink, hook_chain
from bash_sandbox.git_import.state_files import gitdir_named
from bash_sandbox.safe_read import read_regular
from bash_sandbox.view import GitOverlay
from policies import SandboxPolicy
from policies.paths import within, within_any


@dataclass(frozen=True)
class GitInspection:
    """What one spawn found before the command ran."""

    discovery: GitDiscovery
    chain: tuple[ChainLink, ...] = ()

    @property
    def gitdirs(self) -> tuple[str, ...]:
        return self.discovery.gitdirs

    @property
    def partial(self) -> tuple[str, ...]:
        return (*self.discovery.partial, *(c.reason for c in self.chain if not c.covered))

    @property
    def chain_targets(self) -> list[tuple[str, bool]]:
        """(path, is_dir) to cover read-only, as the executor covers hooks paths."""
        return [(c.path, c.is_dir) for c in self.chain if c.covered]

    @property
    def guarded(self) -> dict[str, str]:
        """Covered path -> why, for the denial a refused write there becomes."""
        return {c.path: c.reason for c in self.chain if c.covered}

    def pins(self, roots: tuple[str, ...]) -> tuple[str, ...]:
        """Real directories between a root and each chain path: renaming one would carry a
        cover away and let the command put its own file at the old path, or swap a link a
        home name leads through (uncovered: no mount holds a link) along with its directory."""
        pins: dict[str, None] = {}
        for c in self.chain:
            root = next((r for r in roots if within(c.path, r)), None)
            if root is None:
                continue
            cur = root
            for part in os.path.relpath(c.path, root).split("/")[:-1]:
                cur = os.path.join(cur, part)
                if os.path.isdir(cur) and not os.path.islink(cur):
                    pins[cur] = None
        return tuple(p for p in pins if not within_any(p, self.gitdirs))


def inspect_git(
    policy: SandboxPolicy, known: tuple[str, ...] = (), search: DotGitSearch = find_dotgits
) -> GitInspection:
    """Find the repositories ``policy``'s writable roots reach and what their hooks run."""
    discovery = discover_gitdirs(policy, known=known, search=search)
    chain: dict[str, ChainLink] = {}
    roots = policy.all_writable_roots()
    for entry in discovery.entries:
        link = _dotgit_link(entry) if os.path.dirname(entry.path) in roots else None
        if link is not None:
            chain[link.path] = link
    if policy.protect_hook_chain:
        worktrees = worktrees_of(discovery.entries)
        for gitdir in discovery.gitdirs:
            for link in hook_chain(gitdir, roots, worktrees.get(gitdir)):
                chain.setdefault(link.path, link)
    return GitInspection(discovery, tuple(chain.values()))


REASON_GITFILE = (
    "a checkout's .git file: host git follows it to the repository whose config and hooks it runs"
)


def _dotgit_link(entry: DotGit) -> ChainLink | None:
    """The `.git` file or link of a root's checkout (a linked worktree, a submodule, a
    separate git dir: parallel agent sessions work in one), held as the command found it:
    re-pointed while the command ran, the host's `git status` in the user's own checkout
    ran the config and hooks of a repository the command made (a red team's; put back only
    after the command, never after a kill of the harness). A directory is overlaid; a link
    cannot be covered. A nested checkout's stays the command's to move or remove (`git
    worktree remove`), put back after the command if it was re-pointed."""
    if entry.kind == "file":
        return ChainLink(entry.path, False, REASON_GITFILE)
    if entry.kind == "link":
        why = f"{entry.path} is a symlink, which a command can re-point: {REASON_GITFILE}"
        return ChainLink(entry.path, False, why, covered=False)
    return None


@dataclass
class GitSettlement:
    """What `settle_git` did: repositories to report and warnings for the result."""

    nested: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def settle_git(
    inspection: GitInspection,
    roots: tuple[str, ...],
    overlays: tuple[GitOverlay, ...],
    search: DotGitSearch = find_dotgits,
    *,
    started_ns: int | None = None,
    writable: tuple[str, ...] = (),
) -> GitSettlement:
    """After the command: reset what it created, put back what it changed, and report the
    gitlinks it added (read from each overlay's new index with git's own parser)."""
    done = GitSettlement()
    overlaid = tuple(o.gitdir for o in overlays)
    _settle_entries(
        inspection.discovery,
        roots,
        overlaid,
        search,
        done,
        started_ns=started_ns,
        writable=(*roots, *writable),
    )
    for overlay in overlays:
        new_index = os.path.join(overlay.upper, "index")
        if not os.path.isfile(new_index) or os.path.islink(new_index):
            continue
        old_index = os.path.join(overlay.gitdir, "index")
        added = index_gitlinks(new_index, overlay.gitdir) - index_gitlinks(
            old_index, overlay.gitdir
        )
        worktree = os.path.dirname(overlay.gitdir)
        links = [os.path.join(worktree, p) for p in sorted(added)]
        done.nested += links
        if links:
            done.warnings.append(
                "git: the command added gitlinks (submodules) to the index; review them "
                "before `git submodule update`: " + ", ".join(links)
            )
    return done


def recover_git(
    before: GitDiscovery,
    roots: tuple[str, ...],
    born_by_ns: int | None = None,
    started_ns: int | None = None,
) -> GitSettlement:
    """`settle_git` for a spawn whose executor was killed before it settled
    (`git_settle_record.py`): its overlays' writes never reached the host, so every git dir
    it found counts as overlaid; a repository made after ``born_by_ns`` is the user's."""
    done = GitSettlement()
    _settle_entries(
        before,
        roots,
        before.gitdirs,
        find_dotgits,
        done,
        born_by_ns=born_by_ns,
        started_ns=started_ns,
    )
    return done


def _settle_entries(
    before: GitDiscovery,
    roots: tuple[str, ...],
    overlaid: tuple[str, ...],
    search: DotGitSearch,
    done: GitSettlement,
    *,
    born_by_ns: int | None = None,
    started_ns: int | None = None,
    writable: tuple[str, ...] = (),
) -> None:
    """Reset the repositories made since ``before`` and put back the `.git` entries changed.
    ``writable``: everything the command could write (a git dir born there during the
    command is never the host's)."""
    after = after_command(
        before,
        roots,
        overlaid,
        search=search,
        born_by_ns=born_by_ns,
        host_since_ns=started_ns,
        writable=writable or roots,
    )
    done.warnings += after.warnings
    dropped: list[str] = []
    for gitdir in after.created:
        if not within_any(gitdir, roots):
            continue  # never the command's to have made: nothing outside the roots is reset
        dropped += [os.path.join(gitdir, d) for d in reset_control_plane(gitdir, roots)]
    # Listed in the facts either way; a warning only when the reset took something away
    # (what `git init`, `git clone` or `cargo new` write is kept, and says nothing).
    done.nested += after.created_dotgits
    if dropped:
        done.warnings.append(
            "git: the command created git repositories; reset to git's default control "
            "plane (objects, refs and index kept), dropped: " + ", ".join(dropped[:16])
        )
    if after.restored:
        done.warnings.append("git: .git links or files put back as they were: " + ", ".join(
            after.restored))  # fmt: skip
    if after.second_checkouts:
        done.warnings.append(
            "git: removed .git links or files naming a git directory the command's repository "
            "uses itself (a second main checkout of it, which the next command's import would "
            "take for that git directory's own checkout): " + ", ".join(after.second_checkouts)
        )
    if after.removed:
        done.warnings.append(
            "git: removed .git links or files leading out of the writable roots: "
            + ", ".join(after.removed)
        )


# Linked worktrees whose missing directory a spawn holds, per git directory.
WORKTREES_HELD = 256


def linked_worktree_dirs(
    gitdirs: tuple[str, ...], roots: tuple[str, ...], limit: int | None = None
) -> list[tuple[str, str]]:
    """(root, directory) of each linked worktree ``gitdirs`` name (`worktrees/<id>/gitdir`,
    read as git reads it: `git_import.state_files.worktree_inside`) lying below a root; of
    the first ``limit`` admin directories of each (None: all)."""
    found: list[tuple[str, str]] = []
    for gitdir in gitdirs:
        admins = os.path.join(gitdir, "worktrees")
        try:
            names = os.listdir(admins)[:limit]
        except OSError:
            continue
        for name in names:
            try:
                data = read_regular(os.path.join(admins, name, "gitdir"), 4096)
            except OSError:
                continue
            named = gitdir_named(data)
            if not named.startswith(b"/"):
                continue
            # `gitdir` names the worktree's `.git` file: the worktree is its directory.
            worktree = os.path.dirname(os.path.normpath(os.fsdecode(named)))
            root = next((r for r in roots if within(worktree, r) and worktree != r), None)
            if root is not None and not within_any(worktree, gitdirs):
                found.append((root, worktree))
    return found


def unlink_worktree_links(gitdirs: tuple[str, ...], roots: tuple[str, ...]) -> list[str]:
    """After the command (and its import): a symlink it left where a linked worktree of
    ``gitdirs`` lies, or on the way to one, is removed (the host's `git worktree repair`
    writes `<worktree>/.git` and `remove --force` empties the worktree, through that link,
    outside the roots: a red team's). The links removed."""
    removed: list[str] = []
    # Every one, however many a command registered (a spawn holds the first few only).
    for root, worktree in linked_worktree_dirs(gitdirs, roots):
        path = root
        for part in os.path.relpath(worktree, root).split("/"):
            path = os.path.join(path, part)
            if os.path.islink(path):
                try:
                    os.unlink(path)
                except OSError:
                    break
                removed.append(path)
                break
            if not os.path.isdir(path):
                break
    return removed
