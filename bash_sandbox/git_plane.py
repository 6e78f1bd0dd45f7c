"""Git's control plane: read-only to confined commands, while commits still land.

Writing `.git/config`, `.git/commondir`, `.git/config.worktree`, hooks, `info/`, a submodule's
or a worktree's config makes the host user's next `git` run code the command chose; a
symlink at `.git/COMMIT_EDITMSG` or `.git/logs/HEAD` makes the host's git write outside the
workspace. Covering names one by one cannot hold (a name git creates later, the host's
`config.lock` during `git config`, a rename that detaches a cover). So each git directory in
a writable root is mounted, for one command, as an overlay whose upper layer is private to
that command: every write lands there, never in the host's `.git`.

When the command has ended, `merge_back` imports that upper layer (`bash_sandbox.git_import`):
the command's git directory is treated as an untrusted remote. Nothing it wrote reaches the
host as it is: objects travel by `git fetch` with fsck (hashed; trees naming `.git` or `..`
refused), refs move in one `git update-ref --stdin` transaction of compare-and-swaps against
the values recorded when the command started (`git_import.begin`), the index is rebuilt by
`git update-index --index-info` from what git's own reader lists (git's path rules; no
cache-tree, no unknown extension, no split index); HEAD, pseudo-refs, reflogs, message files
and rebase/sequencer state are parsed, checked and re-written (no `exec` line, no merge
strategy that is not git's own). Config, hooks, `info/`, `commondir` and attributes stay the
host's; each write to them is a denial on the result. A conflict (the host moved a ref or
holds a lock) or a refusal applies nothing of that repository and keeps the command's commits
under `refs/bash-sandbox/<run>/`; the result's `SandboxFacts.git` says which. A crash at any
point is rolled forward or back from a journal by the next executor before it sweeps
anything (`git_import.recover`).

Repositories nested in a root (a workspace that is a folder of repositories, a vendored
checkout) get an overlay too: every `.git` up to three levels below a root, found breadth
first within a budget of listed directories, skipping dependency and cache directories
(`NOT_SEARCHED`); the directories leading to one are pinned, so it cannot be renamed away.

What this cannot stop: a repository the command creates itself (a new `.git`, or a gitlink
added to the index) carries whatever config the command wrote. `nested_repositories`
reports those on the result; treat them as untrusted. A pre-existing repository deeper than
the search, or inside a skipped directory, has no overlay; a search cut short by its budget
makes the run's enforcement partial, and every `.git` an earlier search found is looked at
again (`known`), so flooding a root with directories hides nothing found before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from bash_sandbox.git_import import begin, import_changes, load_snapshot, recover_overlay
from bash_sandbox.view import GitOverlay
from bash_seam import DenialEvidence, DenialKind, GitImportOutcome, GitImportStatus, SandboxDenial
from policies import SandboxPolicy
from policies.paths import within, within_any

MAX_DENIALS = 16


@dataclass
class MergeReport:
    """What the import did: applied names, refused writes, conflicts (as warnings), and the
    typed outcome per repository (this one and its submodules)."""

    applied: list[str] = field(default_factory=list)
    denials: list[SandboxDenial] = field(default_factory=list)
    refused_total: int = 0
    conflicts: list[str] = field(default_factory=list)
    new_gitlinks: list[str] = field(default_factory=list)
    outcomes: list[GitImportOutcome] = field(default_factory=list)  # the repo's, its submodules'

    def refuse(self, path: str, why: str) -> None:
        self.refused_total += 1
        if len(self.denials) < MAX_DENIALS:
            self.denials.append(
                SandboxDenial(
                    kind=DenialKind.FILE_WRITE,
                    target=path,
                    operation="write",
                    reason=f"git control plane ({why})",
                    evidence=DenialEvidence.OVERLAY,
                )
            )


# -- discovery -------------------------------------------------------------------------------


def read_gitfile(path: str) -> str | None:
    """The directory a `.git` file (linked worktree, submodule) points at, absolute."""
    text = _read_small(path)
    if text is None:
        return None
    match = re.match(r"gitdir:\s*(.+?)\s*$", text.splitlines()[0] if text else "")
    if match is None:
        return None
    target = match.group(1)
    if not os.path.isabs(target):
        target = os.path.join(os.path.dirname(path), target)
    return os.path.realpath(target)


# Where a repository lies below a root: this many levels, at most this many directories
# listed per root (breadth first, so the shallow ones are found first), never inside the
# directories that hold installed dependencies or caches (a host user runs no git there).
NESTED_DEPTH = 3
NESTED_BUDGET = 1000
NOT_SEARCHED = frozenset(
    {
        ".git",
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


@dataclass(frozen=True)
class GitDiscovery:
    """The git directories a command could reach through the writable roots; ``unsearched``
    names each root whose search stopped at the budget (deeper repositories there have no
    overlay)."""

    gitdirs: tuple[str, ...]
    unsearched: tuple[str, ...] = ()
    dotgits: tuple[str, ...] = ()  # the `.git` entries they came from (for ``known``)


def discover_gitdirs(
    policy: SandboxPolicy,
    *,
    depth: int = NESTED_DEPTH,
    budget: int = NESTED_BUDGET,
    known: tuple[str, ...] = (),
) -> GitDiscovery:
    """Git directories whose control plane a command could reach through a writable root:
    each `.git` directory at a root or up to ``depth`` levels below it (a workspace that is
    a folder of repositories, a vendored checkout); for a `.git` file (a linked worktree, a
    submodule checkout), the directory it points at and that directory's common dir,
    wherever they are: committing there writes them, and the overlay is what makes that safe
    (only git's own state is copied back). ``known``: `.git` entries an earlier search of
    this executor found, looked at again whatever this search reaches (a command cannot
    hide a repository from later commands by flooding the search's budget)."""
    found: dict[str, None] = {}
    unsearched: list[str] = []
    roots = policy.all_writable_roots()
    entries: dict[str, None] = {}
    for root in roots:
        dotgits, complete = _find_dotgits(root, depth, budget)
        if not complete:
            unsearched.append(root)
        entries.update(dict.fromkeys(dotgits))
    entries.update(dict.fromkeys(d for d in known if within_any(d, roots)))
    for dotgit in entries:
        _add_gitdir(dotgit, found, roots)
    # A git dir inside another one (a worktree's gitdir below the common dir, a submodule's
    # below .git/modules) is covered by the outer overlay.
    kept: list[str] = []
    for d in sorted(found, key=lambda p: (p.count("/"), p)):
        if not any(within(d, k) for k in kept):
            kept.append(d)
    return GitDiscovery(tuple(kept), tuple(unsearched), tuple(entries))


def _find_dotgits(
    root: str,
    depth: int,
    budget: int,
    skip: frozenset[str] = NOT_SEARCHED,
    *,
    links: bool = False,
) -> tuple[list[str], bool]:
    """Every `.git` entry (a link too with ``links``) at ``root`` and up to ``depth``
    levels below it, breadth first, never below a directory named in ``skip``; and whether
    the search was complete within ``budget`` listings."""
    found: list[str] = []
    level = [root]
    for current in range(depth + 1):
        below: list[str] = []
        for directory in level:
            if budget <= 0:
                return found, False
            budget -= 1
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.name == ".git":
                        if links or not entry.is_symlink():
                            found.append(entry.path)
                    elif (
                        current < depth
                        and entry.name not in skip
                        and entry.is_dir(follow_symlinks=False)
                    ):
                        below.append(entry.path)
                except OSError:
                    continue
        level = sorted(below)
    return found, True


def _add_gitdir(dotgit: str, found: dict[str, None], roots: tuple[str, ...]) -> None:
    """The git directories behind one `.git` entry. A `.git` file is the command's to write:
    the directory it names is taken only inside a root, or when that directory points back
    at this very `.git` file the way git itself links them (a linked worktree's `gitdir`, a
    submodule's `core.worktree`); a common dir outside the roots only in git's own layout,
    read where the command cannot write. Otherwise a command could name any host directory
    (`/`, the home) and have the copy-back write git state there."""
    if os.path.isdir(dotgit) and not os.path.islink(dotgit):
        found.setdefault(os.path.realpath(dotgit), None)
        return
    if not os.path.isfile(dotgit) or os.path.islink(dotgit):
        return
    target = read_gitfile(dotgit)
    if target is None or not os.path.isdir(target):
        return
    if not within_any(target, roots) and not _points_back(target, dotgit):
        return
    found.setdefault(target, None)
    common = _read_small(os.path.join(target, "commondir"))
    if common is not None:
        main = os.path.realpath(os.path.join(target, common.strip()))
        # Outside the roots, only git's own layout, read from a directory the command
        # cannot write: the worktree's directory is `<common>/worktrees/<name>`.
        layout = not within_any(target, roots) and os.path.dirname(target) == os.path.join(
            main, "worktrees"
        )
        if os.path.isdir(main) and (within_any(main, roots) or layout):
            found.setdefault(main, None)


def _points_back(gitdir: str, dotgit: str) -> bool:
    """Whether ``gitdir`` names ``dotgit``'s worktree as its own: a linked worktree's
    `gitdir` file holds the path of the `.git` file; a submodule's config holds
    `core.worktree`, relative to the git directory."""
    own = os.path.realpath(dotgit)
    back = (_read_small(os.path.join(gitdir, "gitdir")) or "").strip()
    if back and os.path.realpath(os.path.join(gitdir, back)) == own:
        return True
    config = _read_small(os.path.join(gitdir, "config")) or ""
    return any(
        key == "core.worktree"
        and os.path.realpath(os.path.join(gitdir, value)) == os.path.dirname(own)
        for key, value in _config_values(config)
    )


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode(errors="replace")
    except OSError:
        return None


def prepare_placeholders(
    gitdir: str, upper: str, names: tuple[tuple[str, bool], ...]
) -> tuple[str, ...]:
    """Make empty placeholders in ``upper`` for protected names missing from ``gitdir``, so
    they exist in the merged view and can be covered read-only; returns them (relative)."""
    made: list[str] = []
    for name, is_dir in names:
        if os.path.lexists(os.path.join(gitdir, name)):
            continue
        path = os.path.join(upper, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if is_dir:
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        made.append(name)
    return tuple(made)


# -- hooks paths and includes ------------------------------------------------------------------


_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*?))?\s*$")


def _config_values(text: str) -> Iterator[tuple[str, str]]:
    """(section.key lower-cased, value) pairs of a git config text; enough to find paths."""
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        head = _SECTION.match(line)
        if head is not None:
            name, sub, rest = head.groups()
            section = name.lower() + (f".{sub}" if sub is not None else "")
            line = rest.strip()
            if not line:
                continue
        match = _KEY.match(line)
        if match is None:
            continue
        value = (match.group(2) or "").split(" #")[0].split(" ;")[0].strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        yield f"{section}.{match.group(1).lower()}", value


def config_path_targets(
    gitdir: str, worktree: str, home: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(hooks directories, included config files): the targets of `core.hooksPath` and of
    `include.path`/`includeIf.*.path` in the configs git reads for this repository (system,
    global, local, worktree), following includes. Relative hooks paths are relative to the
    worktree, includes to the file that includes them."""
    configs = [
        "/etc/gitconfig",
        os.path.join(home, ".gitconfig"),
        os.path.join(
            os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "git", "config"
        ),
        os.path.join(gitdir, "config"),
        os.path.join(gitdir, "config.worktree"),
    ]
    hooks: dict[str, None] = {}
    includes: dict[str, None] = {}
    seen: set[str] = set()
    queue = list(configs)
    while queue and len(seen) < 32:
        path = os.path.realpath(queue.pop(0))
        if path in seen:
            continue
        seen.add(path)
        text = _read_small(path)
        if text is None:
            continue
        for key, value in _config_values(text):
            if not value:
                continue
            expanded = os.path.expanduser(value) if value.startswith("~") else value
            if key == "core.hookspath":
                full = expanded if os.path.isabs(expanded) else os.path.join(worktree, expanded)
                hooks.setdefault(os.path.normpath(full), None)
            elif key.startswith("include") and key.endswith(".path"):
                full = (
                    expanded
                    if os.path.isabs(expanded)
                    else os.path.join(os.path.dirname(path), expanded)
                )
                full = os.path.normpath(full)
                includes.setdefault(full, None)
                queue.append(full)
    return tuple(hooks), tuple(includes)


# -- the import -------------------------------------------------------------------------------


def merge_back(overlay: GitOverlay, started_ns: int) -> MergeReport:
    """Import what the command wrote in ``overlay``'s upper layer into the host git directory
    (`bash_sandbox.git_import`: read and checked by git, one transaction, nothing lost)."""
    report = MergeReport()
    snap = load_snapshot(overlay.upper)
    try:
        if snap is None:
            # No snapshot from the spawn (a caller that skipped `begin`): the host as it is
            # now is the start, so a host change during the command is not seen as one.
            snap = begin(overlay.gitdir, overlay.upper)
        result = import_changes(snap, skip=frozenset(overlay.placeholders))
    except Exception as exc:  # whatever failed, the result must say so
        # A transaction cut short is finished or undone from its journal, as after a crash.
        recover_overlay(overlay.upper)
        reason = f"the import failed ({exc}); its journal was rolled forward or back"
        report.conflicts.append(f"{overlay.gitdir}: {reason}")
        report.outcomes = [
            GitImportOutcome(
                repository=overlay.gitdir, status=GitImportStatus.REFUSED, refused=(reason,)
            )
        ]
        return report
    for rel, why in result.denials:
        report.refuse(os.path.join(overlay.gitdir, rel), why)
    report.new_gitlinks = sorted(result.new_gitlinks)
    report.outcomes = [o for o in (result.outcome, *result.modules) if o is not None]
    for outcome in report.outcomes:
        report.applied += list(outcome.applied)
        if outcome.status is GitImportStatus.APPLIED:
            continue
        kept = f"; the command's commits are kept at {outcome.kept_at}" if outcome.kept_at else ""
        reasons = [f"{c.name} (host: {c.host}, command: {c.command})" for c in outcome.conflicts]
        reasons += list(outcome.refused)
        report.conflicts.append(
            f"{outcome.repository}: {outcome.status.value}, nothing applied: "
            f"{'; '.join(reasons[:4])}{kept}"
        )
    return report


# -- nested repositories ----------------------------------------------------------------------


def new_repositories(
    roots: tuple[str, ...],
    started_ns: int,
    *,
    overlaid: tuple[str, ...] = (),
    max_depth: int = 3,
    budget: int = 4000,
) -> list[str]:
    """`.git` entries under ``roots`` created or written since ``started_ns`` (their ctime),
    up to ``max_depth`` levels below each root (dependency directories included: a command
    may plant a repository anywhere), except the overlaid git directories (whose writes never
    reached the host). Bounded: at most ``budget`` directories are listed per root."""
    found: list[str] = []
    for root in roots:
        dotgits, _complete = _find_dotgits(
            root, max_depth, budget, skip=frozenset({".git"}), links=True
        )
        for path in dotgits:
            try:
                fresh = os.lstat(path).st_ctime_ns >= started_ns
            except OSError:
                continue
            if fresh and os.path.realpath(path) not in overlaid:
                found.append(path)
    return sorted(found)
