"""What a repository's installed hooks run: the workspace files hook managers delegate to.

The overlay keeps `.git/hooks` and `core.hooksPath` the host's, but a hook a hook manager
installed runs a file in the worktree, which the command may write; the host's next
`git commit` then runs the command's code. `hook_chain` follows each installed hook to the
files it runs, so the executor covers them read-only like the hook (missing ones held by a
placeholder, their parents pinned) and a refused write names the hook:

- `core.hooksPath` (as host git reads it: system, global and local config with includes,
  `git config --list --show-origin`) pointing inside a writable root: the directory; and
  every config file git reads that lies inside a root (an include's target);
- husky 9 (`core.hooksPath=.husky/_`, each hook sourcing `.husky/_/h`, which runs
  `.husky/<hook>`): the `.husky` directory; husky 5-8 (`core.hooksPath=.husky`) is the
  directory already;
- pre-commit (a hook running `pre-commit hook-impl --config=<file>`): that config, whether
  it exists or not (a missing one makes the hook skip; a planted one makes it run), and
  the workspace files its `entry:` lines name (local hooks run them);
- lefthook (a hook running `lefthook run`): `lefthook.yml` and its other names, the
  `lefthook-local` files it merges in (existing or not), the files its `run:` and
  `script:` lines name, and the `.lefthook/` script directories.

Protection here is a cover, never a copy: the host's own files stay where they are.
`SandboxPolicy.protect_hook_chain` (on by default) turns it off. Not covered: husky 4,
which reads its hooks from `package.json` (covering that file would stop ordinary work; the
run is `partial` and says so), hooks that run workspace files in ways no manager above
writes, and the second link of a chain (`npm test` from `.husky/pre-commit`, a `make` target
from an `entry:`): a hook that runs the project's own code runs what the command wrote there.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass

from bash_sandbox.host_run import run_bounded
from bash_sandbox.kept_answers import KeptAnswers
from bash_sandbox.linux.binaries import host_git, host_git_path
from bash_sandbox.safe_read import blocking_names, read_regular
from policies.paths import within, within_any

# The hooks git runs on a client (githooks(5)).
HOOK_NAMES = frozenset(
    {
        "applypatch-msg",
        "pre-applypatch",
        "post-applypatch",
        "pre-commit",
        "pre-merge-commit",
        "prepare-commit-msg",
        "commit-msg",
        "post-commit",
        "pre-rebase",
        "post-checkout",
        "post-merge",
        "pre-push",
        "post-rewrite",
        "pre-auto-gc",
        "reference-transaction",
        "push-to-checkout",
        "sendemail-validate",
        "fsmonitor-watchman",
        "post-index-change",
    }
)
_LEFTHOOK_CONFIGS = tuple(
    f"{dot}lefthook{local}.{ext}"
    for dot in ("", ".")
    for local in ("", "-local")
    for ext in ("yml", "yaml", "toml", "json")
)
_LEFTHOOK_HELD = ("lefthook.yml", "lefthook-local.yml")  # held even when missing
_LEFTHOOK_DIRS = (".lefthook", ".lefthook-local")
_PRE_COMMIT_CONFIG = re.compile(rb"--config[= ]\s*['\"]?([^\s'\"]+)")
_YAML_COMMAND = re.compile(r"(?:^|[\s{,])(?:entry|run|script)\s*:\s*(.+)$", re.M)
_HOOK_MAX = 1 << 16
_CONFIG_MAX = 1 << 20


@dataclass(frozen=True)
class ChainLink:
    """A workspace path an installed hook runs (``is_dir``: a directory of them)."""

    path: str
    is_dir: bool
    reason: str
    covered: bool = True  # False: a link that cannot be covered, named in the run's partial


@dataclass(frozen=True)
class HostConfig:
    """What host git reads for a repository: every config file (system, global, local and
    each include it follows, as git's own `--show-origin` names them) and `core.hooksPath`."""

    files: tuple[str, ...]
    hooks: str  # the hooks directory git runs hooks from


# Answers of `host_config` per (git directory, HOME, XDG_CONFIG_HOME) (`kept_answers.py`).
_ANSWERS: KeptAnswers[tuple[str, ...], HostConfig] = KeptAnswers()


def host_config(gitdir: str, worktree: str | None = None) -> HostConfig:
    """Ask host git (its own config parser, includes and `includeIf` conditions evaluated for
    ``gitdir``) which files it reads and where it runs hooks from. A relative hooks path is
    relative to the worktree (``worktree``, else its `core.worktree`, else the git
    directory's parent); without one, `<gitdir>/hooks`.

    Asked again only when a file the answer depends on changed: every config file git named,
    every place it would read one from if it appeared (system, global, XDG, the repository's
    and its worktree's), every include target (existing or not) and HEAD (`onbranch:`), each
    stamped with its identity, size, mtime and ctime (no process can set a ctime back). A
    git process costs 2-3 ms of every confined spawn in a repository; a check, 30 us."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    key = (gitdir, worktree or "", env.get("HOME", ""), env.get("XDG_CONFIG_HOME", ""))
    known = _ANSWERS.get(key)
    if known is not None:
        return known
    asked = time.time_ns()
    read = _ask_git(gitdir, env, worktree)
    if read is None:
        return HostConfig((), os.path.join(gitdir, "hooks"))
    answer, includes = read
    watched = tuple(
        dict.fromkeys(
            (*_candidates(gitdir, env), *answer.files, *includes, os.path.join(gitdir, "HEAD"))
        )
    )
    _ANSWERS.keep(key, watched, asked, answer)
    return answer


def _ask_git(
    gitdir: str, env: dict[str, str], worktree: str | None = None
) -> tuple[HostConfig, list[str]] | None:
    """Git's answer, and the include targets its config names (existing or not); None when
    git cannot give one (a FIFO where it reads would stall it until its time bound)."""
    if blocking_names(gitdir):
        return None
    try:
        done = run_bounded(
            [host_git(), "--git-dir", gitdir, "config", "--list", "--show-origin", "-z"],
            env={**env, "PATH": host_git_path()},
            cwd="/",
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    files: dict[str, None] = {}
    includes: list[str] = []
    hooks = os.path.join(gitdir, "hooks")
    hooks_path: str | None = None
    fields = done.stdout.split(b"\0")
    for origin, record in zip(fields[::2], fields[1::2], strict=False):
        source = None
        if origin.startswith(b"file:"):
            source = os.path.normpath(os.fsdecode(origin[5:]))
            files.setdefault(source, None)
        key, _, value = record.partition(b"\n")
        if key == b"core.hookspath" and value:
            hooks_path = os.path.expanduser(os.fsdecode(value))  # `--type=path` expands ~
        elif key == b"core.worktree" and value and worktree is None:
            # Relative to the git directory (git's rule): a submodule's `../../../lib`.
            worktree = os.path.normpath(os.path.join(gitdir, os.fsdecode(value)))
        elif value and (
            key == b"include.path" or (key.startswith(b"includeif.") and key.endswith(b".path"))
        ):
            # Relative to the file that includes it (git's rule); read once it exists.
            target = os.path.expanduser(os.fsdecode(value))
            base = os.path.dirname(source) if source else os.path.dirname(gitdir)
            includes.append(os.path.normpath(os.path.join(base, target)))
    if hooks_path is not None:
        base = worktree or os.path.dirname(gitdir)
        hooks = os.path.normpath(os.path.join(base, hooks_path))
    return HostConfig(tuple(files), hooks), includes


def _candidates(gitdir: str, env: dict[str, str]) -> list[str]:
    """Where git reads config from when the file is there (git-config(1), FILES)."""
    home = env.get("HOME", "")
    xdg = env.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    found = [
        *_system_configs(os.environ.get("PATH")),
        os.path.join(gitdir, "config"),
        os.path.join(gitdir, "config.worktree"),
    ]
    found += [os.path.join(home, ".gitconfig")] if home else []
    found += [os.path.join(xdg, "git", "config")] if xdg else []
    try:
        named = read_regular(os.path.join(gitdir, "commondir"), 4096)
        common = os.path.join(gitdir, named.decode(errors="replace").strip())
        found.append(os.path.normpath(os.path.join(common, "config")))
    except OSError:
        pass  # not a linked worktree's git directory
    return found


@functools.cache
def _system_configs(path: str | None) -> tuple[str, ...]:
    """The system config file git was built to read (`$(prefix)/etc/gitconfig`): /etc for a
    distribution's git, the prefix's own for one built or brewed elsewhere. Keyed by the
    ``PATH`` that finds git (a warm daemon's call runs under its client's)."""
    found = ["/etc/gitconfig"]
    binary = shutil.which("git", path=path)
    if binary is not None:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(binary)))
        found.append(os.path.join(prefix, "etc", "gitconfig"))
    return tuple(dict.fromkeys(found))


def hook_chain(gitdir: str, roots: tuple[str, ...], worktree: str | None = None) -> list[ChainLink]:
    """The workspace files and directories the hooks installed for ``gitdir`` run, inside
    ``roots`` (``worktree``: its checkout; the git directory's parent where not given)."""
    read = host_config(gitdir, worktree)
    worktree = worktree or os.path.dirname(gitdir)
    hooks = read.hooks
    found: dict[str, ChainLink] = {}

    def link(path: str, is_dir: bool, reason: str) -> None:
        path = os.path.normpath(path)
        if within_any(os.path.realpath(path), roots) and not within(path, gitdir):
            found.setdefault(path, ChainLink(path, is_dir, reason))

    shown = _shown(hooks, worktree)
    # A config file git includes from inside a root configures (and runs) the next git.
    for path in read.files:
        link(path, False, f"git config: host git reads {_shown(path, worktree)} (an include)")
    if not within(hooks, gitdir):
        link(hooks, True, f"hook chain: core.hooksPath is {shown}")
    if os.path.basename(hooks) == "_" and os.path.basename(os.path.dirname(hooks)) == ".husky":
        link(os.path.dirname(hooks), True, f"hook chain: husky's hooks in {shown} run .husky/*")
    for name, text in _installed(hooks):
        hook = f"{shown}/{name}"
        if within(hooks, gitdir) and b"husky" in text.lower():
            # husky 4 runs what `package.json` says: covering it would stop ordinary work.
            path = os.path.join(worktree, "package.json")
            why = f"hook chain: {hook} (husky 4) runs what package.json names, which stays writable"
            found.setdefault(path, ChainLink(path, False, why, covered=False))
        if b"hook-impl" in text and b"pre-commit" in text:
            match = _PRE_COMMIT_CONFIG.search(text)
            config = os.fsdecode(match.group(1)) if match else ".pre-commit-config.yaml"
            path = os.path.join(worktree, config)
            why = f"hook chain: {hook} (pre-commit) runs {config}"
            link(path, False, why)
            for target in _commands(path, worktree):
                link(target, False, why)
        if b"lefthook" in text:
            why = f"hook chain: {hook} (lefthook) runs lefthook.yml"
            for config in _LEFTHOOK_CONFIGS:
                path = os.path.join(worktree, config)
                if os.path.lexists(path) or config in _LEFTHOOK_HELD:
                    link(path, False, why)
                    for target in _commands(path, worktree):
                        link(target, False, why)
            for directory in _LEFTHOOK_DIRS:
                if os.path.isdir(os.path.join(worktree, directory)):
                    link(os.path.join(worktree, directory), True, why)
    return list(found.values())


def _shown(hooks: str, worktree: str) -> str:
    return os.path.relpath(hooks, worktree) if within(hooks, worktree) else hooks


def _installed(hooks: str) -> list[tuple[str, bytes]]:
    """(name, first bytes) of each executable hook git would run from ``hooks``."""
    try:
        names = sorted(os.listdir(hooks))
    except OSError:
        return []
    found: list[tuple[str, bytes]] = []
    for name in names:
        if name not in HOOK_NAMES:
            continue
        path = os.path.join(hooks, name)
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
                continue
            found.append((name, read_regular(path, _HOOK_MAX)))
        except OSError:
            continue
    return found


def _commands(config: str, worktree: str) -> list[str]:
    """Workspace files named by a hook manager's `entry:`/`run:`/`script:` lines: every
    word that is an existing file below ``worktree`` (more than it runs, never less of what
    a line names; the config itself is covered, so the list cannot grow during a run)."""
    try:
        text = read_regular(config, _CONFIG_MAX).decode(errors="replace")
    except OSError:
        return []
    found: list[str] = []
    for match in _YAML_COMMAND.finditer(text):
        for word in re.split(r"[\s'\"`;|&(){}\[\],=]+", match.group(1)):
            if not word or word.startswith("-"):
                continue
            path = os.path.normpath(os.path.join(worktree, word))
            if within(path, worktree) and path != worktree and os.path.isfile(path):
                found.append(path)
    return found
