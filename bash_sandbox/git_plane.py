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

Which git directories get an overlay is `git_discovery.py`'s: every repository in a writable
root at any depth (dependency directories searched last, `.git` symlinks and gitfiles
followed as git follows them); the directories leading to one are pinned, so it cannot be
renamed away. A search stopped by its budget makes the run partial and names what it did
not list, and every `.git` an earlier search found is looked at again (`known`), so
flooding a root with directories hides nothing found before. A repository the command
creates has no overlay: after the command it is reset to git's default control plane
(`git_created.py`) and reported in `nested_repositories`; the workspace files installed
hooks run are covered like the hooks (`git_hook_chain.py`).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import time
from dataclasses import dataclass, field

from bash_sandbox.git_discovery import (  # noqa: F401 - discovery's home; names kept here
    DEPENDENCY_DIRS,
    DISCOVERY_BUDGET,
    GitDiscovery,
    discover_gitdirs,
    listed_pairs,
    read_gitfile,
)
from bash_sandbox.git_import import (
    begin,
    import_changes,
    load_snapshot,
    mark_unimported,
    may_keep,
    recover_overlay,
)
from bash_sandbox.git_import.gitcmd import GIT_SAFE_OPTIONS, git_env
from bash_sandbox.host_run import run_bounded
from bash_sandbox.kept_answers import KeptAnswers
from bash_sandbox.linux.binaries import host_git
from bash_sandbox.view import GitOverlay
from bash_seam import DenialEvidence, DenialKind, GitImportOutcome, GitImportStatus, SandboxDenial

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


@dataclass(frozen=True)
class ConfigTargets:
    """What the configs host git reads name on disk: hooks directories (`core.hooksPath`),
    included config files, programs it runs (path -> the key naming it) and template
    directories `git init` and `git clone` copy hooks from."""

    hooks: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    programs: tuple[tuple[str, str], ...] = ()
    templates: tuple[str, ...] = ()
    # (key, word): a path word of a command-valued key this reading could not resolve.
    unresolved: tuple[tuple[str, str], ...] = ()


# Keys whose value is a command host git runs (a shell line), by section and key, any
# subsection (`diff.<driver>.textconv`); and any key named `*cmd`, `*command`, `*program`.
_PROGRAM_KEYS = frozenset(
    {
        ("core", "fsmonitor"),
        ("core", "sshcommand"),
        ("core", "editor"),
        ("core", "pager"),
        ("core", "askpass"),
        ("core", "gitproxy"),
        ("sequence", "editor"),
        ("diff", "external"),
        ("diff", "textconv"),
        ("merge", "driver"),
        ("mergetool", "path"),
        ("difftool", "path"),
        ("filter", "clean"),
        ("filter", "smudge"),
        ("filter", "process"),
        ("credential", "helper"),
        ("uploadpack", "packobjectshook"),
        ("interactive", "difffilter"),
        ("remote", "uploadpack"),
        ("remote", "receivepack"),
        ("sendemail", "smtpserver"),
        ("browser", "path"),
        ("man", "path"),
        ("web", "browser"),
    }
)
_PROGRAM_SUFFIXES = ("cmd", "command", "program")
# Sections every key of which is a command (`pager.log`; `alias.x` when it starts with `!`).
_PROGRAM_SECTIONS = frozenset({"pager", "alias"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _words(line: str) -> list[str]:
    """The words of a shell line as `sh` splits them (quotes, and `;`, `|`, `&`, `(`, `)`,
    `<`, `>` apart): `"${HOME}/my tools/x.sh" a` is one word, then `a`."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: the shell refuses the line; its blanks split it
        return line.split()


_TOPLEVEL = re.compile(
    r"\$\(\s*git\s+rev-parse\s+--show-toplevel\s*\)|`\s*git\s+rev-parse\s+--show-toplevel\s*`"
)
_SUBSTITUTION = re.compile(r"\$\(|`|\)")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&"})
_SCRIPT = re.compile(r"\.(sh|bash|zsh|py|pl|rb|js|mjs|cjs|ts|php|lua|tcl|exe)$")
# A quoted word that is a line of its own (not a path with blanks): commands in it.
_SHELLISH = re.compile(r"[;&|]|\$\(|`")


def _programs(
    key: str, value: str, base: str | None, gitdir: str | None = None
) -> tuple[list[str], list[str]]:
    """The files a command-valued ``key`` may run, and the path words it could not resolve:
    every word of its value that is a path (absolute, `~`, variables of this environment and
    those the line sets expanded, `$GIT_DIR` and `$(git rev-parse --show-toplevel)` as git
    runs it, relative ones against ``base``, the worktree, and each directory the line
    `cd`s to), wherever it stands in the shell line, inside `sh -c '...'`, `$(...)` and
    backquotes too; none for another key."""
    section, name = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
    if section == "alias" or (section, name) == ("submodule", "update"):
        if not value.startswith("!"):
            return [], []  # a git command, or an update mode (`checkout`, `rebase`)
        value = value[1:]
    elif (section, name) == ("credential", "helper") and not value.startswith("!"):
        # `store --file x` runs `git credential-store`, whose arguments are its data (a
        # usability pass: a store file was named a program); `/bin/sh x.sh` is a shell line.
        words = _words(value)[:1]
        first = os.path.expanduser(os.path.expandvars(words[0])) if words else ""
        if not os.path.isabs(first):
            return [], []
    elif not (
        (section, name) in _PROGRAM_KEYS
        or section in _PROGRAM_SECTIONS
        or name.endswith(_PROGRAM_SUFFIXES)
    ):
        return [], []
    found: list[str] = []
    unresolved: list[str] = []
    known = {"GIT_DIR": gitdir} if gitdir is not None else {}
    _shell_paths(value.removeprefix("!"), base, known, found, unresolved, depth=0)
    return list(dict.fromkeys(found)), unresolved


def _shell_paths(
    line: str,
    base: str | None,
    known: dict[str, str],
    found: list[str],
    unresolved: list[str],
    *,
    depth: int,
) -> None:
    """`_programs` for one shell line (recursing into quoted and substituted lines)."""
    if depth > 3:
        return
    if base is not None:
        line = _TOPLEVEL.sub(base, line)
    bases = [base] if base is not None else []
    words = _words(line)
    for i, raw in enumerate(words):
        if (i > 0 and words[i - 1] == "-c") or _SHELLISH.search(raw):
            # `sh -c 'x/y.sh "$@"'`, `$(...)`, backquotes: a line of its own.
            inner = _SUBSTITUTION.sub(" ", raw)
            _shell_paths(inner, base, known, found, unresolved, depth=depth + 1)
            continue
        assignment = _ASSIGNMENT.match(raw)
        word = _expand(raw[assignment.end() :] if assignment else raw, known)
        if assignment and i + 1 < len(words) and words[i + 1] not in _SEPARATORS:
            pass  # `A=/x cmd`: the command's environment, its value may be a file it runs
        elif assignment:
            known[raw[: assignment.end() - 1]] = word  # `D=/x; $D/y.sh`: a value, not a file
            continue
        if i > 0 and words[i - 1] == "cd":
            # `cd tools && ./x.sh`: later relative words are relative to it.
            bases = [os.path.normpath(os.path.join(b, word)) for b in bases or ["/"]]
            continue  # a directory, never a file to cover
        if word.startswith("-"):
            word = word.partition("=")[2]  # `--file=/x`: the value; a bare option: nothing
        if "$" in word:
            if "/" in word:
                unresolved.append(raw)
            continue
        if "://" in word:
            continue  # a URL
        if os.path.isabs(word):
            found.append(os.path.normpath(word))
        elif "/" in word:
            # A relative word is a path where it is spelled as one or lies there (a script),
            # not `origin/main` in `git log origin/main..`: a placeholder `origin` would be
            # held in every repository the alias's config reaches.
            for b in bases:
                path = os.path.normpath(os.path.join(b, word))
                if word.startswith(("./", "../")) or _SCRIPT.search(word) or os.path.lexists(path):
                    found.append(path)


def _expand(word: str, known: dict[str, str]) -> str:
    """``word`` with the variables the line set (``known``), then this environment's, and
    `~` expanded."""
    for name, value in known.items():
        word = word.replace("${" + name + "}", value).replace("$" + name, value)
    return os.path.expanduser(os.path.expandvars(word))


# Each config file's (key, value) pairs as git's own parser reads them, kept by its stamp.
_PAIRS: KeptAnswers[str, tuple[tuple[str, str], ...]] = KeptAnswers(limit=64)


def _config_pairs(path: str) -> tuple[tuple[str, str], ...]:
    """(section.key lower-cased but the subsection, value) of the config file at ``path``
    (a real path), read by `git config --list` (quoting, escapes and line continuations as
    git reads them; includes listed, not followed); none where it is not a regular file."""
    kept = _PAIRS.get(path)
    if kept is not None:
        return kept
    try:
        st = os.stat(path)
    except OSError:
        return ()
    if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
        return ()  # a fifo git would wait on, a device: never asked
    asked = time.time_ns()
    try:
        done = run_bounded(
            [host_git(), "config", "--file", path, "--no-includes", "--list", "-z"],
            env=git_env(),
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    listed = listed_pairs(done.stdout) if done.returncode == 0 else []
    answer = tuple((k, v) for k, v in listed if v is not None)
    _PAIRS.keep(path, (path,), asked, answer)
    return answer


def config_path_targets(gitdir: str | None, worktree: str | None, home: str) -> ConfigTargets:
    """What the configs git reads for this repository (system, global, local, worktree;
    ``gitdir`` None: those every repository of the host reads) name on disk, following
    includes whatever their conditions (`ConfigTargets`). Relative hooks paths and programs
    are relative to the worktree (None: not known, left out), includes to the file that
    includes them."""
    configs = [
        "/etc/gitconfig",
        os.path.join(home, ".gitconfig"),
        os.path.join(
            os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "git", "config"
        ),
        # Where the harness's environment moves them (the user's shell may not).
        *(os.environ[v] for v in ("GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL") if os.environ.get(v)),
    ]
    if gitdir is not None:
        configs += [os.path.join(gitdir, "config"), os.path.join(gitdir, "config.worktree")]
    hooks: dict[str, None] = {}
    includes: dict[str, None] = {}
    programs: dict[str, str] = {}
    templates: dict[str, None] = {}
    unresolved: list[tuple[str, str]] = []
    seen: set[str] = set()
    queue = list(configs)
    while queue and len(seen) < 32:
        path = os.path.realpath(queue.pop(0))
        if path in seen:
            continue
        seen.add(path)
        for key, value in _config_pairs(path):
            if not value:
                continue
            expanded = os.path.expanduser(value) if value.startswith("~") else value
            if key == "core.hookspath":
                if not os.path.isabs(expanded) and worktree is None:
                    continue
                full = (
                    expanded if os.path.isabs(expanded) else os.path.join(worktree or "", expanded)
                )
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
            elif key == "init.templatedir":
                if os.path.isabs(expanded):
                    templates.setdefault(os.path.normpath(expanded), None)
            else:
                paths, words = _programs(key, value, worktree, gitdir)
                for program in paths:
                    programs.setdefault(program, key)
                unresolved += [(key, w) for w in words]
    return ConfigTargets(
        tuple(hooks),
        tuple(includes),
        tuple(programs.items()),
        tuple(templates),
        tuple(dict.fromkeys(unresolved)),
    )


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
        reason = f"the import failed ({exc}); its journal was rolled forward or back"
        if not recover_overlay(overlay.upper):
            # Not even kept (a full disk before the fetch): the upper layer holds the only
            # copy of the command's objects, so it outlives this spawn and is tried again;
            # within the bound of kept layers unless the disk is full (a failure the command
            # can cause every time must not fill the disk with retries: a red team's).
            if may_keep(overlay.gitdir, overlay.upper) and mark_unimported(overlay.upper):
                reason += (
                    "; the command's git state is kept (this uid's state directory, "
                    "`exec-kept-*`) and a later executor imports its commits into keep-refs"
                )
            else:
                reason += "; the command's git state could not be kept"
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
    if result.outcome is not None and result.outcome.status is GitImportStatus.APPLIED:
        for path in report.new_gitlinks:
            failure = init_submodule(overlay.gitdir, path)
            if failure is not None:
                report.conflicts.append(
                    f"{overlay.gitdir}: submodule {path} not initialised: {failure}"
                )
    for outcome in report.outcomes:
        report.applied += list(outcome.applied)
        if outcome.status is GitImportStatus.APPLIED:
            continue
        kept = f"; the command's commits are kept at {outcome.kept_at}" if outcome.kept_at else ""
        if result.unimported and not outcome.kept_at:
            kept = (
                "; the command's git state is kept (this uid's state directory, `exec-kept-*`)"
                " and a later executor imports its commits into keep-refs once git takes them"
            )
        reasons = [f"{c.name} (host: {c.host}, command: {c.command})" for c in outcome.conflicts]
        reasons += list(outcome.refused)
        report.conflicts.append(
            f"{outcome.repository}: {outcome.status.value}, nothing applied: "
            f"{'; '.join(reasons[:4])}{kept}"
        )
    return report


def init_submodule(gitdir: str, path: str) -> str | None:
    """`git submodule init -- <path>` in the host repository for a gitlink the command added:
    what the host user would run, so the submodule is usable at once. It is git's own reader
    of `.gitmodules` (a worktree file, the command's to write anyway) and writes only the
    submodule's `url` and `active` into the host's config (git refuses an `update` command
    from `.gitmodules`); the host git runs without hooks or outside config. None when done,
    else why not."""
    worktree = os.path.dirname(gitdir)
    modules = os.path.join(worktree, ".gitmodules")
    if not os.path.isfile(modules) or os.path.islink(modules):
        return "no regular .gitmodules"
    try:
        argv = [host_git(), *GIT_SAFE_OPTIONS, f"--git-dir={gitdir}", f"--work-tree={worktree}"]
        done = run_bounded(
            [*argv, "submodule", "init", "--", path],
            env=git_env(),
            cwd=worktree,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip()[-300:] or f"exit {done.returncode}"
    return None
