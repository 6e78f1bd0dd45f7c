"""`HostSurvey`: what the host looks like for one confined spawn, taken just before it.

The survey finds the git directories in the writable roots (each becomes an overlay with
the protected names inside it as placeholders in its private upper layer), the protected
names elsewhere (covered where they lie, or a refcounted host placeholder when missing),
the `core.hooksPath` and included configs inside a root, the shadows and covers for denied
paths, and which of those names the cover watch must follow while the command runs. Any
doubt it cannot settle (a search cut short, a protected name behind a symlink) becomes a
`partial` line, and the run's enforcement says so. The result is a `HostView` (`view.py`):
data the backends render and the mount plan applies.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from bash_sandbox import git_import, git_settle_record, running_spawns
from bash_sandbox.backends.mount_plan import (
    Shadow,
    _first_missing,
    _pins_between,
    inspect_protected,
    tmp_tops,
    visible,
)
from bash_sandbox.backends.shadow_cache import ShadowCache
from bash_sandbox.cache_domains import cache_top, ensure_cache_base, locks_dir
from bash_sandbox.envrc_chain import envrc_chain
from bash_sandbox.git_discovery import (
    DotGit,
    DotGitSearch,
    enclosing_gitdirs,
    outside_gitdirs,
    worktrees_of,
)
from bash_sandbox.git_hook_chain import ChainLink, hook_chain
from bash_sandbox.git_plane import config_path_targets, prepare_placeholders
from bash_sandbox.git_spawn import (
    WORKTREES_HELD,
    GitInspection,
    inspect_git,
    linked_worktree_dirs,
)
from bash_sandbox.hg_chain import hg_chain
from bash_sandbox.link_restore import snapshot_links
from bash_sandbox.own_code import REASON as OWN_CODE
from bash_sandbox.own_code import import_dirs, own_installation, package_names, startup_names
from bash_sandbox.placeholder_linger import LingeringPlaceholders
from bash_sandbox.placeholder_stash import STASH_DIR
from bash_sandbox.placeholders import Placeholders
from bash_sandbox.safe_read import read_regular
from bash_sandbox.state import ExecutorState
from bash_sandbox.view import GitOverlay, HostView
from policies import SandboxMode, SandboxPolicy, host_secrets
from policies.autorun import UNPROTECT_KEY, home_paths
from policies.paths import within, within_any, within_set


def denied_paths(deny_read: tuple[str, ...]) -> tuple[str, ...]:
    """What a spawn's shadows hide: the policy's `deny_read`, then the host's own secrets
    whatever it says (the warm daemon's seeded survey is keyed on the same tuple)."""
    return (*deny_read, *host_secrets())


def _pins_within(hidden: tuple[str, ...], roots: tuple[str, ...]) -> list[str]:
    """The real directories between a root and each path hidden inside it (a spill dir
    configured inside a workspace, another TMPDIR's base, a `deny_read` file): each is
    hidden by a mount on its path, so renaming a directory above it would carry it out from
    under that mount (and out of the registry, or away from the denied name) for the next
    command to read; pinned, a rename of one fails."""
    return [
        pin
        for path in hidden
        for root in roots
        if within(path, root) and path != root
        for pin in _pins_between(root, path)
    ]


class HostSurvey:
    """One executor's surveys: its placeholders, its shadow cache, the `.git` entries
    earlier spawns found (looked at again by every later one, so flooding a root with
    directories hides nothing found before), and its repository search."""

    def __init__(self, state: ExecutorState, search: DotGitSearch, linger_s: float = 0.0) -> None:
        self._state = state
        self.search = search
        self._placeholders = LingeringPlaceholders(
            Placeholders(stash=os.path.join(state.path, STASH_DIR)), linger_s
        )
        # Per deny list: the real paths its names were covered at (`_take`).
        self._deny_seen: dict[tuple[str, ...], dict[str, None]] = {}
        self._shadows = ShadowCache()
        self._known_dotgits: dict[str, None] = {}
        self._unshadowed_memo: tuple[object, tuple[str, ...]] | None = None
        # Spawns taken and not yet settled (`settled`), and the `.git` entries (kind, where
        # they led) the last survey with none of them found: a running command's plant is
        # never a separate git dir's main checkout (`git_import.main_checkout_inside`).
        self._running = 0
        self._running_lock = threading.Lock()
        self._quiet_dotgits: dict[str, tuple[str, str | None]] = {}
        # Per running spawn: what a successor settles if this process is killed.
        self._settle_records: dict[int, str | None] = {}
        self._heartbeat = git_settle_record.Heartbeat()

    def settled(self, token: int) -> None:
        """A spawn `take` surveyed is over and its `.git` entries settled (`settle_git`)."""
        with self._running_lock:
            self._running -= 1
        record = self._settle_records.pop(token, None)
        if record is not None:
            git_settle_record.drop(record)
            self._heartbeat.release(record)
        running_spawns.end(token)

    def release(self, held: tuple[str, ...]) -> None:
        """Give back the host placeholders one survey acquired."""
        self._placeholders.release_all(held)

    def let_go(self) -> None:
        """Give back the placeholders kept for a next spawn that no spawn holds now."""
        self._placeholders.let_go()

    def close(self) -> None:
        """Give back the placeholders kept for a next spawn (the executor closes)."""
        self._placeholders.close()

    def warm(self, policy: SandboxPolicy, mounts: bool, user_policy: SandboxPolicy) -> None:
        """The read-only part of `take` for ``policy``, ahead of its first spawn: the
        repository search and what the hooks run, the protected names' inspection, the
        shadows of the deny list. What they cache is checked again at every `take`, as
        between two spawns; nothing is made on the host (no placeholder, no overlay, no
        import intent)."""
        if not mounts:
            return
        git = inspect_git(user_policy, known=tuple(self._known_dotgits), search=self.search)
        if user_policy.protect_hook_chain:
            # What an allowed `.envrc` loads: read now, kept by stamp for `take`.
            envrc_chain(user_policy.all_writable_roots(), user_policy.unprotected_paths)
        self._known_dotgits.update(dict.fromkeys(git.discovery.dotgits))
        inspect_protected(user_policy, git.gitdirs)
        self._shadows.inspect(denied_paths(policy.deny_read), policy.all_writable_roots())

    def take(
        self, policy: SandboxPolicy, mounts: bool, user_policy: SandboxPolicy
    ) -> tuple[HostView, tuple[str, ...], GitInspection | None, int]:
        """See `_take`; placeholders acquired before a failure are given back. The git
        inspection (None without mounts: nothing is overlaid) is what `settle_git` reads.
        Call `settled` with the token once the spawn's command is over and settled."""
        held: list[str] = []
        found: list[GitInspection] = []
        with self._running_lock:
            quiet = self._running == 0
            self._running += 1
        # What a command could plant in: a read-only one plants nothing.
        writes = mounts and policy.mode is SandboxMode.WORKSPACE_WRITE
        token = running_spawns.begin(id(self), policy.all_writable_roots() if writes else ())
        try:
            view = self._take(policy, mounts, user_policy, held, found, quiet=quiet)
            if writes and found:
                # Before the command starts: settled by a successor if this process is killed.
                record = git_settle_record.write(
                    self._state.path, token, found[0].discovery, user_policy.all_writable_roots()
                )
                if record is not None:
                    self._heartbeat.hold(record)
                self._settle_records[token] = record
        except BaseException:
            self.release(tuple(held))
            self.settled(token)
            raise
        return view, tuple(held), found[0] if found else None, token

    def _take(
        self,
        policy: SandboxPolicy,
        mounts: bool,
        user_policy: SandboxPolicy,
        held: list[str],
        found: list[GitInspection],
        *,
        quiet: bool,
    ) -> HostView:
        """Inspect the host for one spawn: overlays, protected names, shadows, covers; and
        the host placeholders this spawn now holds (give them back with `release`).
        ``user_policy`` is the policy before the executor added its own roots (the tool
        cache home has no git directory or protected names)."""
        partial: list[str] = []
        roots = policy.all_writable_roots()
        hidden = self._state.hidden_paths(roots)
        locks = locks_dir()
        if locks is not None:
            hidden = (*hidden, locks)
        if not mounts:
            return HostView(hidden=hidden)
        private_tmp = True
        tops = tmp_tops((policy.workspace_root, *roots))
        # The user's roots: the sandbox's own cache home has no git dir or protected names.
        # Before the `.git` entries are read: a command over these roots that ran at any
        # time since then may have planted one (`_trusted_dotgits`).
        reading = time.time_ns()
        git = inspect_git(user_policy, known=tuple(self._known_dotgits), search=self.search)
        if user_policy.protect_hook_chain:
            # What an allowed `.envrc` loads, and what an hg config includes, is covered as
            # the hook chain is.
            user_roots = user_policy.all_writable_roots()
            loaded = envrc_chain(user_roots, user_policy.unprotected_paths)
            loaded += hg_chain(user_roots, user_policy.unprotected_paths)
            if loaded:
                git = replace(git, chain=(*git.chain, *loaded))
        # A home's own environment a root holds (`policies.autorun.HOME_PATHS`), likewise.
        home = home_links(user_policy)
        if home:
            git = replace(git, chain=(*git.chain, *home))
        # Hooks paths and included configs inside a root run or configure the host's git:
        # the host's own configs' too, with no repository in the roots (a red team's
        # `~/.gitconfig.local` in a home workspace).
        # The repository a root lies in (a monorepo's package as the workspace): its hooks
        # path, includes and what its hooks run inside the root, the same.
        # And a checkout in the roots whose git dir lies outside them (a separate git dir,
        # a linked worktree of a repository elsewhere): its config names files here too.
        enclosing = (
            *enclosing_gitdirs(user_policy.all_writable_roots()),
            *outside_gitdirs(git.discovery.entries, roots),
        )
        if enclosing and user_policy.protect_hook_chain:
            links = [link for g, w in enclosing for link in hook_chain(g, roots, w)]
            git = replace(git, chain=(*git.chain, *links))
        # Relative names resolve against each repository's worktree, which is not its git
        # dir's parent for a linked worktree, a submodule or a separate git dir.
        worktrees = {**worktrees_of(git.discovery.entries), **dict(enclosing)}
        config, unsure = self._git_config_links(
            (*git.gitdirs, *(g for g, _ in enclosing)),
            roots,
            {c.path for c in git.chain},
            worktrees,
        )
        partial += unsure
        # The harness's own code (a project's `.venv` it runs from): a `.pth` planted there
        # ran in the next harness process, unconfined (a red team's).
        own, why_partial = _own_code_links(roots, {c.path for c in (*git.chain, *config)})
        config += own
        partial += why_partial
        if config:
            git = replace(git, chain=(*git.chain, *config))
        found.append(git)
        self._known_dotgits.update(dict.fromkeys(git.discovery.dotgits))
        trusted = self._trusted_dotgits(git.discovery.entries, roots, quiet, reading)
        gitdirs = git.gitdirs
        # A search cut short, a hook chain that cannot be covered: named, and partial.
        partial += git.partial
        protected = inspect_protected(user_policy, gitdirs)
        overlays: list[GitOverlay] = []
        covers = list(protected.protect)
        for gitdir in gitdirs:
            upper = self._state.git_upper()
            names: list[tuple[str, bool]] = []
            for g, name, is_dir in protected.in_git:
                if g != gitdir:
                    continue
                path = os.path.join(gitdir, name)
                if not os.path.islink(path):
                    names.append((name, is_dir))
                    covers.append(path)
                    continue
                # A link out of the git dir: host git follows it, so its target is covered.
                target = os.path.realpath(path)
                if within_any(target, roots):
                    if os.path.exists(target):
                        covers.append(target)
                    else:
                        partial.append(f"{path} links to {target}, which does not exist yet")
            made = prepare_placeholders(gitdir, upper.upper, tuple(names))
            # What the import compares with; and whether the main checkout of a separate git
            # dir is in the roots (unknown: the import keeps its HEAD and index the host's).
            inside = git_import.main_checkout_inside(gitdir, trusted, roots)
            git_import.begin(gitdir, upper.upper, roots, main_inside=inside)
            overlays.append(GitOverlay(gitdir, upper.upper, upper.work, made))
        # A missing protected name outside git: a placeholder of the right kind, covered,
        # removed once no command of this uid needs it (`placeholders.py`). An existing one
        # may be a placeholder an earlier command still holds: held too, so that command's
        # end cannot remove it under this one (the cover watch would stop this command).
        existing = [(path, os.path.isdir(path)) for path in protected.protect]
        held += self._placeholders.acquire_all([*protected.missing, *existing])
        covers += [path for path, _ in protected.missing]
        if protected.symlinked:
            partial.append("a protected name is a symlink inside a writable root")
        # A root holding the sandbox's cache homes (a workspace that is the user's home):
        # read-only here, its path pinned, so no command plants code in another domain's
        # cache or links for the sweep (`cache_domains.exposed_to`).
        cache_pins = self._cover_cache_homes(roots, covers)
        # The workspace files the installed hooks run (`git_hook_chain.py`), the configs and
        # hooks paths host git reads there, a home's environment: covered where they exist.
        # The missing ones are held in one ledger transaction.
        # An existing one may be another command's placeholder (a home's `~/.cargo`): held
        # too, as protected names are, so that command's end cannot remove it under this one.
        missing: list[tuple[str, bool]] = []
        present: list[tuple[str, bool]] = []
        for path, is_dir in git.chain_targets:
            if os.path.lexists(path):
                covers.append(os.path.realpath(path))
                present.append((path, is_dir))
            else:
                missing.append((path, is_dir))
        chain_held = self._placeholders.acquire_all([*missing, *present])
        held += chain_held
        covers += chain_held
        # A missing linked worktree the host's git dirs name inside a root is held (the
        # directories on its way pinned), so no command puts a link there that the host's
        # `git worktree repair` or `remove` then follows out of the roots.
        worktree_pins, worktree_gaps = _linked_worktrees(gitdirs, roots)
        gaps_held = self._placeholders.acquire_all((gap, True) for gap in worktree_gaps)
        held += gaps_held
        covers += gaps_held
        # The host's own secrets stay hidden whatever the policy's deny_read says.
        denied = denied_paths(policy.deny_read)
        # What these names led to at an earlier spawn stays denied: a command that removed
        # or re-pointed a link on the way (`.env -> config/env.local`) would otherwise read
        # the file under its own name at the next call.
        seen = self._deny_seen.setdefault(denied, {})
        shadows, deny_dirs, deny_files = self._shadows.inspect(
            (*denied, *(p for p in seen if p not in denied)), roots
        )
        seen.update(dict.fromkeys(p for p in (*deny_dirs, *deny_files) if p not in hidden))
        # A denied name missing inside a root is held by a placeholder, covered unreadable:
        # only watched, a command made it in one rename (`mv -T st ~/.ssh`) with content
        # host tools then obeyed, and the stop came after (a red team's).
        more_dirs, more_files = self._hold_denied(roots, gitdirs, (*deny_dirs, *covers), held)
        deny_dirs += more_dirs
        deny_files += more_files
        # The executor's private paths are its own directories: covered, never shadowed.
        # Those out of sight (under the host's /tmp, which the private one hides) are not
        # looked at: a machine may have recorded hundreds.
        deny_dirs = tuple(p for p in deny_dirs if visible(p, tops, private_tmp))
        deny_dirs += tuple(p for p in hidden if visible(p, tops, private_tmp) and _a_directory(p))
        deny_files = tuple(p for p in deny_files if visible(p, tops, private_tmp))
        shadows = tuple(s for s in shadows if visible(s.directory, tops, private_tmp))
        # What a host rename or delete would uncover while the command runs: every name
        # covered where it lies, every denied name missing outside the shadows, and each
        # shadowed directory with every directory above it (a snapshot is a mount on the
        # directory: the host's `rm -rf` or `mv` of it, or of a parent, and a new one made
        # at the path, would show the command a secret written there since).
        watched = [p for p in (*deny_dirs, *deny_files) if p not in hidden]
        watched += _with_ancestors(s.directory for s in shadows)
        # The same for a name covered where it lies (above its directory), and every link
        # on the way to a denied name (the host's `ln -sfn` of a generation link leads the
        # path to a directory nothing covers).
        watched += _with_ancestors(os.path.dirname(p) for p in watched)
        watched += self._shadows.links
        watched += [c for c in covers if not within_any(c, gitdirs)]
        watched += [
            name for name in self._unshadowed(denied, shadows, tops) if not os.path.lexists(name)
        ]
        view = HostView(
            shadows=shadows,
            tmp_tops=tops,
            overlays=tuple(overlays),
            pins=(
                *protected.pins,
                *worktree_pins,
                *git.pins(roots),
                *cache_pins,
                *_pins_within((*hidden, *deny_dirs, *deny_files), roots),
            ),
            protect=tuple(dict.fromkeys(covers)),
            deny_dirs=deny_dirs,
            deny_files=deny_files,
            hidden=hidden,
            partial=tuple(partial),
            watched=tuple(dict.fromkeys(watched)),
            file_binds=self._excludes(overlays, held),
            links=snapshot_links([c.path for c in git.chain if not c.covered], roots),
            placeholders=tuple(
                p
                for p in dict.fromkeys(
                    (*(p for p, _ in protected.missing), *(p for p, _ in missing), *gaps_held)
                )
                if p in held
            ),
        )
        return view

    def _trusted_dotgits(
        self,
        entries: tuple[DotGit, ...],
        roots: tuple[str, ...],
        quiet: bool,
        reading: int,
    ) -> tuple[DotGit, ...]:
        """The `.git` entries that may make a separate git dir's checkout count as inside:
        with no command of this executor running, all (a finished one's plant was removed
        when it settled), remembered; while one runs, only those a quiet survey found
        leading where they lead now (what it plants meanwhile is not settled yet). Nor is a
        survey quiet while another executor of this uid has a command running over a root
        that holds or lies in these (`running_spawns`): that command's plant is that
        executor's to remove, and this one's import wrote an outside checkout through it
        (a red team's: another executor, a CLI process, one whose workspace was a
        sub-directory, one with another `TMPDIR`)."""
        if quiet and any(e.kind != "dir" for e in entries):
            # No other command over them at any time since the entries were read (a plant
            # read, then removed with its record before this question: a red team's).
            quiet = not running_spawns.others_over(id(self), roots, reading)
        if not quiet:
            return tuple(
                e for e in entries if self._quiet_dotgits.get(e.path) == (e.kind, e.target)
            )
        for path in [p for p in self._quiet_dotgits if within_any(p, roots)]:
            del self._quiet_dotgits[path]
        self._quiet_dotgits.update((e.path, (e.kind, e.target)) for e in entries)
        return entries

    def _hold_denied(
        self,
        roots: tuple[str, ...],
        gitdirs: tuple[str, ...],
        covered: tuple[str, ...],
        held: list[str],
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Hold each denied name the last shadow survey covers where it lies that is missing
        inside a root (or its first missing directory), as protected names are held: a
        mount point, so `mv` onto it fails (EBUSY) and nothing is made below it. (dirs,
        files) to cover unreadable. One inside a name ``covered`` (denied, or read-only) or
        a placeholder held already needs none. Always a directory: git never shows an empty
        one (an empty file was `?? .env` in the host's `git status`, which `git add -A`
        tracked, a later secret one commit away; a red team's). An empty directory on its
        way may be another command's placeholder for it (`~/.composer` for
        `.composer/auth.json`): held instead when the ledger knows it, so that command's end
        cannot remove it under this one."""
        wanted: dict[str, bool] = {}
        maybe: dict[str, tuple[str, bool]] = {}  # an empty parent -> the name to hold else
        hidden = {*covered, *held}
        for path in self._shadows.candidates:
            if path in roots or not within_any(path, roots) or within_any(path, gitdirs):
                continue
            if os.path.lexists(path) or within_set(path, hidden):
                continue
            if os.path.realpath(path) != path:
                continue  # through a link: its resolved path is a candidate of its own
            root = next(r for r in roots if within(path, r))
            first = _first_missing(path, root)
            if first is None:
                continue
            parent = os.path.dirname(first)
            if parent != root and _empty_directory(parent):
                maybe.setdefault(parent, (first, True))
            else:
                wanted.setdefault(first, True)
        if not wanted and not maybe:
            return (), ()
        got = self._placeholders.acquire_all([*wanted.items(), *((p, True) for p in maybe)])
        later: dict[str, bool] = {}
        for parent, (first, is_dir) in maybe.items():
            if parent in got:
                wanted[parent] = True  # another command's placeholder: covered as it did
            else:
                later.setdefault(first, is_dir)  # the user's own empty directory
        if later:
            got += self._placeholders.acquire_all(later.items())
            wanted.update((p, d) for p, d in later.items() if p not in wanted)
        held += got
        dirs: list[str] = []
        files: list[str] = []
        for name, is_dir in wanted.items():
            if name in got:
                (dirs if is_dir else files).append(name)
                continue
            # Made meanwhile by someone else (not ours to hold): covered as it is.
            path = os.path.realpath(name)
            if os.path.exists(path):
                (dirs if os.path.isdir(path) else files).append(path)
        return tuple(dirs), tuple(files)

    def _excludes(self, overlays: list[GitOverlay], held: list[str]) -> tuple[tuple[str, str], ...]:
        """For each overlaid repository with host placeholders in its worktree: its
        `info/exclude` as the command sees it, the host's plus those placeholders, anchored.
        `git stash -u` and `git clean -d` remove untracked directories: on the placeholders
        (mount points) they failed halfway, the files already stashed (a usability pass).
        Git reads this file in addition to the user's own excludes, which stay as they are;
        the host's file is unchanged, and the import never takes `info/` back. A copy of
        this spawn's: the command may add its own lines, kept for its own run only."""
        binds: list[tuple[str, str]] = []
        for overlay in overlays:
            if os.path.basename(overlay.gitdir) != ".git":
                continue  # no worktree of its own to anchor at
            top = os.path.dirname(overlay.gitdir)
            names = sorted(
                "/" + os.path.relpath(p, top)
                for p in held
                if within(p, top) and not within(p, overlay.gitdir)
            )
            target = os.path.join(overlay.gitdir, "info", "exclude")
            if not names or not _a_directory(os.path.dirname(target)):
                continue  # no `info` of its own (a link: a red team's led it to a secret)
            try:
                own = read_regular(target, 1 << 20, follow=False)
            except OSError:
                continue  # none to stand in for (git makes one at init), or a link
            text = (
                own
                + b"\n# bash-sandbox: its placeholders\n"
                + "\n".join(_literal(n) for n in names).encode()
                + b"\n"
            )
            binds.append((target, self._spawn_file("git-excludes", text)))
        return tuple(binds)

    def _spawn_file(self, kind: str, data: bytes) -> str:
        """``data`` as a file of the executor's state for one spawn (the spawn removes it:
        `ConfinedSpawn._survey`), which its command may write: a bind source no command
        can reach otherwise."""
        path = os.path.join(self._state.path, f"{kind}-{secrets.token_hex(8)}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return path

    def _unshadowed(
        self, denied: tuple[str, ...], shadows: tuple[Shadow, ...], tops: tuple[str, ...]
    ) -> tuple[str, ...]:
        """The denied names no shadow holds and the view shows: only they can appear
        uncovered while a command runs. A function of the shadow survey, which is the same
        object from spawn to spawn while nothing changed: kept for the last one (each name
        against each shadow was 0.2 ms of every spawn)."""
        key = (denied, shadows, tops)
        if self._unshadowed_memo is not None and self._unshadowed_memo[0] == key:
            return self._unshadowed_memo[1]
        names = tuple(
            name
            for name in map(os.path.normpath, denied)
            if not any(within(name, s.directory) for s in shadows)
            and visible(name, tops, private_tmp=True)
        )
        self._unshadowed_memo = (key, names)
        return names

    @staticmethod
    def _cover_cache_homes(roots: tuple[str, ...], covers: list[str]) -> list[str]:
        """Cover the cache homes' directory when a root holds it; the pins on its way."""
        top = cache_top()
        owner = next((r for r in roots if top is not None and within(top, r)), None)
        if top is None or owner is None:
            return []
        # Made now if missing: a command must not be the one that creates it.
        if not ensure_cache_base() or not os.path.isdir(top) or os.path.islink(top):
            return []  # a link there: no process uses caches under it (`_real_base`)
        covers.append(top)
        return _pins_between(owner, top)

    @staticmethod
    def _git_config_links(
        gitdirs: tuple[str, ...],
        roots: tuple[str, ...],
        known: set[str],
        worktrees: dict[str, str],
    ) -> tuple[list[ChainLink], list[str]]:
        """What the host's own configs and each of ``gitdirs``' name inside a writable root
        (`git_plane.ConfigTargets`: hooks paths, includes whatever their condition, since
        host git evaluates it for repositories elsewhere too, programs it runs, template
        directories), as chain links, but those ``known`` already; and why the run is
        partial where a path word could not be resolved."""
        home = os.path.expanduser("~")
        found: dict[str, ChainLink] = {}
        unsure: dict[str, None] = {}
        for gitdir in (None, *gitdirs):
            worktree = None if gitdir is None else worktrees.get(gitdir, os.path.dirname(gitdir))
            named = config_path_targets(gitdir, worktree, home)
            links = [
                *((p, True, f"hook chain: core.hooksPath is {p}") for p in named.hooks),
                *(
                    (p, False, f"git config: host git reads {p} (an include)")
                    for p in named.includes
                ),
                *((p, False, f"git config: host git runs {p} ({k})") for p, k in named.programs),
                *(
                    (
                        p,
                        True,
                        f"git config: git init and clone copy hooks from {p} (init.templateDir)",
                    )
                    for p in named.templates
                ),
            ]
            for path, is_dir, why in links:
                real = os.path.realpath(path)
                # A root itself is never covered whole for a name in a config.
                if path not in known and real not in roots and within_any(real, roots):
                    found.setdefault(path, ChainLink(path, is_dir, why))
            # A path word no reading resolves (`$(cmd)/x.sh`, a variable the user's shell
            # sets): where it may lead into a root (a repository's configs; a fixed part in
            # a root), the run cannot say it is covered.
            for key, word in named.unresolved:
                fixed = os.path.expanduser(word.split("$", 1)[0].split("`", 1)[0])
                if gitdir is not None or (os.path.isabs(fixed) and within_any(fixed, roots)):
                    unsure.setdefault(f"git config: {key} runs {word!r}, a path not resolved")
        return list(found.values()), list(unsure)


def _own_code_links(roots: tuple[str, ...], known: set[str]) -> tuple[list[ChainLink], list[str]]:
    """The sandbox's own installation inside ``roots`` (`own_code.py`) as chain links, but
    those ``known``; and why the run is partial where the harness imports from a root."""
    own = own_installation()
    links = [
        ChainLink(path, True, f"{OWN_CODE}: {path}")
        for path in own
        if path not in known and any(within(path, r) and path != r for r in roots)
    ]
    # The modules Python imports at start from a directory on its path that lies in a root
    # (an editable install's source tree: `sitecustomize.py` there ran in the next harness
    # process, a red team's): those names only, held while missing.
    links += [
        ChainLink(path, False, f"{OWN_CODE} (imported at start): {path}")
        for path in startup_names()
        if path not in known and within_any(path, roots) and not within_any(path, own)
    ]
    # Any other name there the harness probes for and misses (`copy` asks for
    # `org.python.core`; pydantic loads every plugin an `*.dist-info` there declares) cannot
    # be held by name: the run says so (a red team's).
    inside = [d for d in import_dirs() if within_any(d, roots)]
    partial = [
        f"the harness imports from {d}, inside a writable root: a module or package metadata "
        "a command puts there can run in a later harness process; install bash-sandbox "
        "outside the roots"
        for d in inside
    ]
    # This package's own names there, held (`python -m bash_sandbox.cli` started in the
    # workspace imported a `bash_sandbox/` a command made: a red team's).
    links += [
        ChainLink(path, False, f"{OWN_CODE} (imported from {d}): {path}")
        for d in inside
        for path in package_names(d)
        if path not in known and not within_any(path, own)
    ]
    return links, partial


def _linked_worktrees(
    gitdirs: tuple[str, ...], roots: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """For each missing linked worktree of ``gitdirs`` (`worktrees/<id>/gitdir`) in a root:
    its first missing component (to hold with a placeholder directory) and the real
    directories between the root and it (pins: a rename would carry the placeholder away).
    An existing one is left writable (`git worktree remove` must work); a link put in its
    place is taken away after the command (`git_spawn.unlink_worktree_links`)."""
    pins: list[str] = []
    gaps: list[str] = []
    for root, worktree in linked_worktree_dirs(gitdirs, roots, WORKTREES_HELD):
        gap = _first_missing(worktree, root)
        if gap is not None:
            pins += _pins_between(root, gap)
            gaps.append(gap)
    return list(dict.fromkeys(pins)), list(dict.fromkeys(gaps))


def home_links(policy: SandboxPolicy) -> list[ChainLink]:
    """The home paths (`HOME_PATHS`) inside ``policy``'s roots, as chain links: covered
    where they exist (a link among them cannot be: named in the run's partial), held by a
    placeholder while missing where the entry says so."""
    links: dict[str, ChainLink] = {}
    roots = policy.all_writable_roots()
    for path, entry in home_paths(roots, policy.unprotected_paths):
        home = os.path.expanduser("~")
        name = "~/" + os.path.relpath(path, home) if within(path, home) else path
        why = f"the home's {name}: {entry.reason}; {UNPROTECT_KEY} lifts it"
        if os.path.islink(path):
            why = f"the home's {name} is a symlink, which a command can re-point: {entry.reason}"
            links.setdefault(path, ChainLink(path, entry.is_dir, why, covered=False))
        elif os.path.lexists(path):
            links.setdefault(path, ChainLink(path, entry.is_dir, why))
        elif entry.hold:
            # Held at its first missing directory (`~/.julia` for `.julia/config`), as a
            # protected name is: a placeholder, never directories made and left behind.
            root = next((r for r in roots if within(path, r)), None)
            first = _first_missing(path, root) if root is not None else None
            hold = path if first is None else first
            links.setdefault(hold, ChainLink(hold, entry.is_dir or hold != path, why))
    return list(links.values())


def _literal(name: str) -> str:
    """``name`` as a gitignore pattern matching it literally."""
    return "".join("\\" + c if c in "\\*?[]!# " else c for c in name)


def _empty_directory(path: str) -> bool:
    """A directory itself (not a link to one) with nothing in it."""
    if not _a_directory(path):
        return False
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _a_directory(path: str) -> bool:
    """A directory itself, not a link to one (one lstat: a spawn asks it of every hidden path)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _with_ancestors(directories: Iterable[str]) -> list[str]:
    """Each directory and every one above it but `/`, once."""
    found: dict[str, None] = {}
    for directory in directories:
        path = directory
        while path not in ("/", "") and path not in found:
            found[path] = None
            path = os.path.dirname(path)
    return list(found)
