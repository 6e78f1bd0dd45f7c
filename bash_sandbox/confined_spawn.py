"""`ConfinedSpawn`: one confined command's scope, from its checks to its last release.

`open()` acquires the stages in order, each registering its own release on one
`ExitStack` at the line that acquires it, so a failure at any stage gives back exactly what
the stages before it took (and `close()` gives back everything, once):

    check -> trust domain's namespaces -> cache home -> survey (placeholders, overlays)
    -> cover watch -> egress grant -> environment -> limits -> supervisor channel
    -> the backend's wrap

`settled()` reads, in this order and in one place: the limits (their counters live in the
command's cgroup), the supervisor, the git copy-back, and the facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bash_local.environment import build_command_env
from bash_local.spawn import Launcher, SpawnOutcome, SpawnPlan, SpawnScope
from bash_sandbox.backends.base import BackendContext, ConfinedPlan, SandboxBackend
from bash_sandbox.backends.child_failure import child_error, read_child_failure
from bash_sandbox.cache_domains import (
    REASON_CACHE_HOMES,
    cache_moved,
    cache_top,
    exposed_to,
    exposes,
    named_cache_folder,
)
from bash_sandbox.egress_guards import egress_setting_problem
from bash_sandbox.environment import sandbox_inherited_env
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.facts import collect_hints, derive_facts_flags, summarize
from bash_sandbox.git_plane import MergeReport, merge_back
from bash_sandbox.git_spawn import GitInspection, settle_git, unlink_worktree_links
from bash_sandbox.link_restore import put_back
from bash_sandbox.linux.binaries import host_git
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.compiled_launcher import compiled_launcher
from bash_sandbox.linux.cover_watch import CoverWatchError
from bash_sandbox.linux.helper_client import helper_can_launch
from bash_sandbox.linux.limits import LimitsPlan, LimitsSetupError, tmpfs_full
from bash_sandbox.linux.namespaces import NamespaceFds
from bash_sandbox.linux.supervisor import (
    ConnectPolicy,
    SupervisedCommand,
    identity,
    receive_listener,
)
from bash_sandbox.linux.write_watch import write_policy
from bash_sandbox.loop_turns import give_way
from bash_sandbox.mirrors import mirror_hint, mirror_hosts
from bash_sandbox.safe_read import read_regular
from bash_sandbox.services import SandboxServices
from bash_sandbox.tool_env import confined_environment, tool_cache_home
from bash_sandbox.view import GitOverlay, HostView
from bash_seam import BashExecSpec, SandboxDenial, SandboxFacts
from policies import (
    LimitExceeded,
    NetworkMode,
    SandboxEnforcement,
    SandboxMode,
    SandboxPolicy,
)
from policies.paths import within, within_any

if TYPE_CHECKING:
    from bash_sandbox.egress import ProxyGrant
    from policies.egress import EgressCredential


@dataclasses.dataclass(frozen=True)
class SpawnSettings:
    """What the executor decided for every spawn: from its config and its selector."""

    allow_domains: tuple[str, ...] = ()
    tool_caches: bool = True
    degraded: str | None = None  # the selector's warning, when it fell back
    credentials: tuple[EgressCredential, ...] = ()
    hosts_file: str | None = None
    collect_evidence: bool = True  # False only for `scripts/bench-facts`


class ConfinedSpawn(SpawnScope):
    """A confined spawn's scope. Build it with `open()`; the executor drives the rest."""

    plan: ConfinedPlan

    def __init__(
        self,
        services: SandboxServices,
        spec: BashExecSpec,
        policy: SandboxPolicy,
        backend: SandboxBackend,
        settings: SpawnSettings,
    ) -> None:
        self._services = services
        self._spec = spec
        self._user_policy = policy  # before the executor adds its own cache home
        self.policy = policy
        self.backend = backend
        self._settings = settings
        self._stack = contextlib.ExitStack()
        self.started_ns = 0
        self.enforcement = SandboxEnforcement.FULL
        self.overlays: tuple[GitOverlay, ...] = ()
        self.cache_home: str | None = None
        self.grant: ProxyGrant | None = None
        self.limits: LimitsPlan | None = None
        self.warnings: list[str] = []
        self._listener: socket.socket | None = None
        self._supervised: SupervisedCommand | None = None
        self._kill: Callable[[], None] | None = None
        self._cover_lost = False
        self._limit_exceeded: LimitExceeded | None = None
        self._full_before = (False, False)  # whether each shared tmpfs was full at start
        self._merges: list[MergeReport] = []
        self._nested: tuple[str, ...] = ()
        self._denials_seen: tuple[tuple[SandboxDenial, ...], int] = ((), 0)
        self._mirror_hosts: list[str] = []
        self._git: GitInspection | None = None
        # Loopback connects the command's own namespace refused (None: nobody watched).
        self._loopback_refused: tuple[str, ...] | None = None
        # Given back once the command is over, before the copy-back (`_release_early`).
        self._early: list[_Idempotent] = []
        # (target, this spawn's file bound there, its content as made): `HostView.file_binds`.
        self._stand_ins: list[tuple[str, str, bytes | None]] = []
        self._links: tuple[tuple[str, str, str], ...] = ()
        self._made: frozenset[str] = frozenset()  # the placeholders the survey made
        self._domain: NamespaceFds | None = None  # this call's trust domain's namespaces

    @classmethod
    async def open(
        cls,
        services: SandboxServices,
        spec: BashExecSpec,
        base: SpawnPlan,
        *,
        policy: SandboxPolicy,
        backend: SandboxBackend,
        settings: SpawnSettings,
    ) -> ConfinedSpawn:
        scope = cls(services, spec, policy, backend, settings)
        try:
            # The base plan's own release (a long command's memfd) is the stack's from here.
            if base.release is not None:
                scope._stack.callback(base.release)
                base = dataclasses.replace(base, release=None)
            await scope._acquire(base)
        except BaseException:
            scope.close()
            raise
        return scope

    @classmethod
    def warm(
        cls,
        services: SandboxServices,
        spec: BashExecSpec,
        *,
        policy: SandboxPolicy,
        backend: SandboxBackend,
        settings: SpawnSettings,
    ) -> None:
        """The stages of `open` that make nothing the host sees, for ``spec``, ahead of its
        first spawn (`SandboxBashExecutor.warm`): the checks, its trust domain's namespaces,
        the cache home (held, as a spawn holds it, until the executor closes), the
        environment's settings, and the survey's read-only part (`HostSurvey.warm`). Nothing
        is spawned, planned or watched."""
        scope = cls(services, spec, policy, backend, settings)
        try:
            scope._check()
            if backend.mounts:
                services.domain_namespaces(policy)  # the domain's loopback and ptys, kept
            scope._add_cache_home()
            scope._environment()
            services.survey.warm(scope.policy, backend.mounts, scope._user_policy)
        finally:
            scope.close()

    async def _acquire(self, base: SpawnPlan) -> None:
        """Every stage, in order; each registers its own release where it acquires. What
        does not depend on the host's view comes first; the loop takes a turn before the
        survey and another before the plan (0.5-1.5 ms of work each), so the harness's own
        tasks wait for one part, never the whole. A covered path that vanishes meanwhile
        fails the spawn before anything ran (`ViewChangedError`, looked at again); one
        replaced meanwhile is seen by the cover watch, which stops the command."""
        self._check()
        self._domain = await self._domain_namespaces()
        self._add_cache_home()
        self.grant = self._egress_grant()
        env = self._environment()
        self.limits = self._prepare_limits()
        listener_fd = self._supervisor_channel()
        await give_way()
        view = self._survey()
        view = self._watch_covers(view)
        await give_way()
        self.plan = self._wrap(dataclasses.replace(base, env=env), view, listener_fd)

    # -- the stages ------------------------------------------------------------------------

    def _check(self) -> None:
        """Refuse, before anything is acquired, what this spawn cannot confine."""
        policy, backend, services = self.policy, self.backend, self._services
        services.state.check(policy)
        binary = backend.binary
        if binary is not None and within_any(os.path.realpath(binary), policy.all_writable_roots()):
            raise SandboxUnavailableError(
                policy.mode,
                f"the {backend.name} binary {binary} lies inside a writable root: "
                "a command could replace it",
            )
        with contextlib.suppress(FileNotFoundError):  # no git: nothing of git runs after
            if within_any(host_git(), policy.all_writable_roots()):
                raise SandboxUnavailableError(
                    policy.mode,
                    f"the git the executor runs after each command ({host_git()}) lies inside "
                    "a writable root: a command could replace it",
                )
        if policy.network is NetworkMode.ISOLATED and backend.mounts:
            # Every command in the namespace can reach the proxy, which serves requests
            # without a grant token under the executor's list: a per-call list without all
            # of it cannot be enforced, so it is refused rather than silently widened.
            missing = [e for e in self._settings.allow_domains if e not in policy.allow_domains]
            if missing:
                raise SandboxUnavailableError(
                    policy.mode,
                    f"this call's allow_domains {list(policy.allow_domains)} lacks the "
                    f"executor's {missing}, and the executor's proxy serves requests without a "
                    "grant token under the executor's list: keep the executor's entries in a "
                    "per-call allowlist, or use an executor configured with the narrower list",
                )
            problem = egress_setting_problem(
                policy, credentials=self._settings.credentials, hosts_file=self._settings.hosts_file
            )
            if problem is not None:
                raise SandboxUnavailableError(policy.mode, problem)
        # Prepared off the loop before every spawn; a hand-driven spawn may come without.
        services.prepare(policy.mode, backend)

    def _add_cache_home(self) -> None:
        """The sandbox's own cache home, writable like a root for this spawn only."""
        policy = self.policy
        if policy.mode is not SandboxMode.WORKSPACE_WRITE or not self._settings.tool_caches:
            return
        # Per trust domain, held until the executor closes (`cache_domains.py`).
        services = self._services
        self.cache_home = tool_cache_home(policy, services.cache_holds, services.cache_reach)
        if self.cache_home is None and exposed_to(policy):
            self.warnings.append(
                "the tool cache homes (~/.cache/bash-sandbox) lie inside a writable root, "
                "where a command could plant code for other projects: read-only here, and "
                "package caches live in this call's private /tmp"
            )
            return
        if self.cache_home is None:
            self.warnings.append(
                "no tool cache home under ~/.cache (not writable): package caches "
                "live in this call's private /tmp"
            )
            return
        moved = cache_moved()
        if moved is not None:
            # Replaced by the user, or by a command whose root holds the link: never followed.
            self.warnings.append(
                f"{named_cache_folder()} now leads to {moved}; the tool caches stay in "
                f"{self.cache_home}, below where it led when bash-sandbox first used it"
            )
        self.policy = policy.model_copy(
            update={"writable_roots": (*policy.writable_roots, self.cache_home)}
        )

    def _survey(self) -> HostView:
        """The host as it is now: overlays, placeholders, shadows, covers (`host_view.py`)."""
        survey = self._services.survey
        self.started_ns = time.time_ns()
        view, held, self._git, token = survey.take(
            self.policy, self.backend.mounts, self._user_policy
        )
        # Once the stack closes: after the copy-back settled what the command left.
        self._stack.callback(survey.settled, token)
        self._stack.callback(self._early_release(functools.partial(survey.release, held)))
        for target, source in view.file_binds:  # this spawn's files (`HostView.file_binds`)
            self._stack.callback(_unlink_quietly, source)
            self._stand_ins.append((target, source, _content(source)))
        for overlay in view.overlays:
            self._stack.callback(self._services.recycle_upper, overlay)
        self.overlays = view.overlays
        self._links = view.links
        self._made = frozenset(view.placeholders)
        return view

    def _watch_covers(self, view: HostView) -> HostView:
        """The names this spawn covers where they lie are watched (`linux/cover_watch.py`):
        the command is stopped if the host replaces one while it runs."""
        if not view.watched:
            return view
        try:
            watch = self._services.cover_watch()
            ticket = watch.watch(view.watched, self._cover_replaced)
        except (CoverWatchError, RuntimeError) as exc:
            why = f"covers are not watched ({exc}): a host change of a covered name uncovers it"
            return dataclasses.replace(view, partial=(*view.partial, why))
        self._stack.callback(self._early_release(functools.partial(watch.release, ticket)))
        return view

    async def _domain_namespaces(self) -> NamespaceFds | None:
        """The loopback, abstract sockets and ptys of this call's trust domain, shared with
        no wider or narrower call (`linux/namespaces.py`); made off the loop the first time
        the domain spawns (a fork and a wait)."""
        if not self.backend.mounts:
            return None
        services = self._services
        ready = services.domain_ready(self._user_policy)
        if ready is not None:
            return ready
        return await asyncio.to_thread(services.domain_namespaces, self._user_policy)

    def _egress_grant(self) -> ProxyGrant | None:
        grant = self._services.egress_grant(self.policy, self.backend, self._domain)
        if grant is not None:
            self._stack.callback(grant.close)
        return grant

    def _environment(self) -> dict[str, str]:
        spec, grant = self._spec, self.grant
        mirrors = self._services.mirrors.settings(os.environ)  # the user's indexes, no secrets
        self.warnings += mirrors.warnings
        inherited = {
            name: value
            for name, value in sandbox_inherited_env(os.environ).items()
            if name not in mirrors.judged
        } | mirrors.env
        env = confined_environment(
            build_command_env(inherited, spec.env, spec.dsh_env),
            self.policy,
            private_tmp=self.backend.mounts,
            cache_home=self.cache_home,
            proxy_env=grant.environment() if grant is not None else None,
            request_env=spec.env,
        )
        self._mirror_hosts = mirror_hosts(env)
        return env

    def _prepare_limits(self) -> LimitsPlan:
        limits = self._services.limits
        try:
            plan = limits.prepare(
                f"spawn-{next(self._services.spawn_ids)}",
                self.policy.limits,
                own_user_namespace=self.backend.own_user_namespace,
            )
        except LimitsSetupError as exc:
            raise SandboxUnavailableError(self.policy.mode, str(exc)) from exc
        self._stack.callback(limits.release, plan)
        self.warnings += limits.warnings
        # The executor's tmpfs is shared by its commands: one full already is not this
        # command's limit (a red team's earlier command filled it; `false` then read as it).
        ns = self._services.namespaces.ready
        if ns is not None:
            self._full_before = (tmpfs_full(ns.tmp), tmpfs_full(ns.shm))
        return plan

    def _supervisor_channel(self) -> int:
        """The socket the child sends its seccomp listener over; the child's end is its fd."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._stack.callback(ours.close)
        self._stack.callback(theirs.close)
        self._listener = ours
        return theirs.fileno()

    def _wrap(self, plan: SpawnPlan, view: HostView, listener_fd: int) -> ConfinedPlan:
        services, backend, policy = self._services, self.backend, self.policy
        namespaces = self._domain
        # The private /tmp and /dev/shm of this policy's trust domain (`trust_domain.py`).
        scratch = services.state.scratch_for(policy, namespaces) if namespaces else None
        if self.grant is not None and namespaces is not None and scratch is not None:
            # The proxy's trust bundle (credentials) where this command's /tmp is.
            from bash_sandbox.egress.credentials import share_bundle

            share_bundle(namespaces.tmp, scratch.domain)
        # The helper builds the child's steps itself: only their calls are recorded here.
        helper = services.spawn_helper() if sys.platform == "linux" else None
        # Without it, the compiled child from this process where it is built; else `Popen`.
        here = compiled_launcher() if helper is None and sys.platform == "linux" else None
        ctx = BackendContext(
            sources=services.state.sources,
            view=view,
            namespaces=namespaces,
            scratch=scratch,
            stage=services.state.stage,
            private_tmpdir=self._private_tmpdir,
            listener_fd=listener_fd,
            limits=self.limits,
            record_only=helper is not None,
            hold_init=helper is not None or here is not None,
            mount_table=services.mount_table.read() if backend.mounts else None,
        )
        confined = backend.wrap(policy, plan, ctx)
        if confined.release is not None:
            self._stack.callback(confined.release)
        self.enforcement = backend.enforcement(policy)
        if view.partial:
            self.enforcement = SandboxEnforcement.PARTIAL
        if self._settings.degraded:
            self.warnings.append(self._settings.degraded)
        self.warnings += [*backend.partial_reasons(policy), *view.partial]
        launcher: Launcher | None = None
        if helper is not None and helper_can_launch(confined):
            launcher = helper
        elif isinstance(confined.preexec_fn, ChildSetup):
            confined = dataclasses.replace(confined, preexec_fn=confined.preexec_fn.materialized())
            launcher = here
        if services.helper_failure is not None:
            self.warnings.append(f"{services.helper_failure}; spawned from the executor")
        # The stack owns the release; the plan that spawns carries none.
        return dataclasses.replace(confined, release=None, launcher=launcher)

    # -- spawned, or not -------------------------------------------------------------------

    def spawned(self, pid: int, kill: Callable[[], None]) -> None:
        self._kill = kill
        if self.plan.after_spawn is not None:
            self.plan.after_spawn()
        if self._cover_lost:
            kill()
        sock = self._listener
        if sock is None:
            return
        try:
            listener = receive_listener(sock)
        except OSError as exc:
            raise SandboxUnavailableError(
                self.policy.mode,
                f"the sandboxed command did not hand over its seccomp listener: {exc}",
            ) from exc
        finally:
            sock.close()
        supervisor = self._services.supervisor()
        self._supervised = supervisor.register(listener, self._connect_policy())
        self._stack.callback(self._unregister)

    def failed(self, exc: BaseException) -> Exception:
        failure = read_child_failure(self.plan.report_fd)
        return child_error(self.policy.mode, self.backend.name, failure, exc)

    def _cover_replaced(self, name: str) -> None:
        """The host changed a name this running command covers: it is stopped now."""
        self.warnings.append(
            f"stopped: {name}, which this command had covered, was replaced, removed or "
            "made while it ran (by the host, or by the command through another name; a "
            "replaced name is no longer covered); run it again"
        )
        if self._kill is not None:
            self._kill()
        else:
            self._cover_lost = True  # not spawned yet: killed as soon as it is

    def _connect_policy(self) -> ConnectPolicy:
        policy, backend, services = self.policy, self.backend, self._services
        dirs = [identity(root) for root in policy.all_writable_roots()]
        devices: list[int] = []
        ns = services.namespaces.ready
        if ns is not None and backend.mounts:
            devices = [os.fstat(fd).st_dev for fd in (ns.tmp, ns.shm)]
        else:
            dirs.append(identity(self._private_tmpdir))
        sockets = [identity(p) for p in policy.allow_unix_sockets if not p.startswith("@")]
        names = [p[1:].encode() for p in policy.allow_unix_sockets if p.startswith("@")]
        # Loopback and abstract names are the command's own only in the executor's private
        # network namespace; under the host network they are the host's.
        private = policy.network is NetworkMode.ISOLATED and backend.network_namespace != "none"
        return ConnectPolicy(
            isolated=policy.network is NetworkMode.ISOLATED,
            private_loopback=private,
            socket_dirs=frozenset(d for d in dirs if d is not None),
            socket_devices=frozenset(devices),
            sockets=frozenset(s for s in sockets if s is not None),
            abstract_names=frozenset(names),
            nameservers=services.nameservers,
            writes=write_policy(
                policy,
                backend.binary,
                view_mounts=backend.mounts,
                scratch=(self._private_tmpdir,),
                guarded=self._guarded,
                placeholders=self._made,
            ),
        )

    @functools.cached_property
    def _private_tmpdir(self) -> str:
        """The private TMPDIR of this policy's trust domain (made once a spawn)."""
        return self._services.state.tmpdir_for(self.policy)

    @functools.cached_property
    def _guarded(self) -> dict[str, str] | None:
        """Covered paths inside a root that are not protected names, with their reasons:
        what the installed git hooks run, and the cache homes a root holds. Once a spawn,
        after the survey: the write watch and the hints read the same answer."""
        guarded = dict(self._git.guarded) if self._git is not None else {}
        top = cache_top()
        if self.backend.mounts and top is not None and exposes(top, self._user_policy):
            guarded[top] = REASON_CACHE_HOMES
        return guarded or None

    # -- settled ---------------------------------------------------------------------------

    async def settled(self, outcome: SpawnOutcome) -> SandboxFacts | None:
        if not outcome.started:
            return self._base_facts()
        self._read_limits(outcome)
        self._unregister()
        if self._copies_back:
            self._release_early()
            # Git's processes and the host's disk: in a thread, so the loop keeps serving.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._services.settle_pool(), _Once(self._copy_back))
        return self._facts(outcome)

    @property
    def _copies_back(self) -> bool:
        """Whether anything can come back to the host: only a workspace-write view can
        hold git overlays and repositories the command created."""
        return self.policy.mode is SandboxMode.WORKSPACE_WRITE and self.backend.mounts

    def close(self) -> None:
        self._stack.close()

    def _early_release(self, call: Callable[[], None]) -> _Idempotent:
        release = _Idempotent(call)
        self._early.append(release)
        return release

    def _release_early(self) -> None:
        """The command is over: its cover watch (first: nothing it sees now can stop it)
        and the host placeholders, before the copy-back, whose search then never lists the
        placeholder directories (16 listings and watches a spawn, made and dropped)."""
        for release in reversed(self._early):
            release()

    def _read_limits(self, outcome: SpawnOutcome) -> None:
        if self.limits is None:
            return
        ns = self._services.namespaces.ready
        self._limit_exceeded = self._services.limits.outcome(
            self.limits,
            exit_code=outcome.exit_code,
            signal=outcome.signal,
            stderr_text=outcome.stderr,
            tmp_root=ns.tmp if ns is not None else None,
            shm_root=ns.shm if ns is not None else None,
            full_before=self._full_before,
        )

    def _unregister(self) -> None:
        supervised, self._supervised = self._supervised, None
        if supervised is not None:
            self._services.supervisor().unregister(supervised)
            self._denials_seen = supervised.snapshot()
            self._loopback_refused = supervised.loopback_connects()

    def _copy_back(self) -> None:
        """Git's state back to the host (`git_plane.py`), and the repositories the command
        created or changed reported (only where `_copies_back`)."""
        policy = self.policy
        # The sandbox's own cache home holds tools' git checkouts (cargo): not the user's.
        roots = tuple(r for r in policy.all_writable_roots() if r != self.cache_home)
        nested: list[str] = []
        if self._git is not None:
            # Created repositories reset to git's default control plane, changed `.git`
            # links put back (`git_spawn.py`): a boundary, so never skipped.
            search = self._services.survey.search
            # What else the command wrote (its cache home, its TMPDIR): a git dir made
            # there is never one the host made meanwhile (a red team's).
            writable = (*policy.all_writable_roots(), self._private_tmpdir)
            settled = settle_git(
                self._git,
                roots,
                self.overlays,
                search,
                started_ns=self.started_ns,
                writable=writable,
            )
            nested += settled.nested
            self.warnings += settled.warnings
        for overlay in self.overlays:
            report = merge_back(overlay, self.started_ns)
            self._merges.append(report)
            nested += [
                os.path.join(os.path.dirname(overlay.gitdir), p) for p in report.new_gitlinks
            ]
            self.warnings += [f"git: not copied back: {c}" for c in report.conflicts]
        for root, path, value in self._links:
            done = put_back(root, path, value)
            if done is not None:
                self.warnings.append(f"{done} (a host tool reads through it)")
        unlinked = unlink_worktree_links(tuple(o.gitdir for o in self.overlays), roots)
        if unlinked:
            self.warnings.append(
                "git: removed symlinks the command left where a linked worktree lies (the "
                "host's `git worktree repair` or `remove` would follow them out of the "
                "writable roots): " + ", ".join(unlinked)
            )
        # What the command wrote to a stand-in (`info/exclude`) stays in it, as a write to the
        # git directory's control plane in the overlay would: refused, and said so.
        stand_ins = MergeReport()
        for target, source, made in self._stand_ins:
            if _content(source) != made:
                stand_ins.refuse(target, os.path.basename(os.path.dirname(target)))
        if stand_ins.denials:
            self._merges.append(stand_ins)
        self._nested = tuple(dict.fromkeys(nested))

    def _base_facts(self, **fields: Any) -> SandboxFacts:
        policy = self.policy
        return SandboxFacts(
            mode=policy.mode,
            denied=fields.pop("denied", False),
            enforcement=self.enforcement,
            backend=self.backend.name,
            network=policy.network,
            **fields,
        )

    def _facts(self, outcome: SpawnOutcome) -> SandboxFacts:
        policy, backend = self.policy, self.backend
        started = backend.command_started(self.plan)
        failure = backend.runner_failure(outcome.exit_code, outcome.stderr, started)
        if failure is not None:
            if not outcome.background:
                raise SandboxUnavailableError(policy.mode, failure)
            return self._base_facts(runner_failed=True)
        seen, total = self._denials_seen
        denials: list[SandboxDenial] = list(seen)
        for report in self._merges:
            denials += report.denials
            total += report.refused_total
        if self.grant is not None:
            denials += [d.to_sandbox_denial() for d in self.grant.denials()]
            total += self.grant.denials_total
            self.warnings += self.grant.notes()  # pinned answers used, named
        # The output only points (hints); denials above are evidence. Bounded and grouped.
        hints = (
            collect_hints(
                outcome.stdout,
                outcome.stderr,
                denials=denials,
                # The command's loopback is its own only in a network namespace of its own.
                private_loopback=policy.network is NetworkMode.ISOLATED
                and backend.network_namespace != "none",
                loopback_connects=self._loopback_refused,
                **self._inference_context(),
            )
            if self._settings.collect_evidence
            else []
        )
        lists = summarize(denials, total, hints)
        denied, network_denied = derive_facts_flags(
            lists.denials, outcome.exit_code, outcome.signal, folds_signals=self.plan.folds_signals
        )
        if network_denied and not policy.allow_domains and self._mirror_hosts:
            self.warnings.append(mirror_hint(self._mirror_hosts))
        return self._base_facts(
            denied=denied,
            network_denied=network_denied,
            denials=lists.denials,
            denials_total=lists.total,
            denial_groups=lists.groups,
            hints=lists.hints,
            nested_repositories=self._nested,
            git=tuple(o for r in self._merges for o in r.outcomes),
            limit_exceeded=self._limit_exceeded,
            limits_enforcement=self.limits.summary if self.limits is not None else None,
            warnings=tuple(dict.fromkeys(self.warnings)),
        )

    def _inference_context(self) -> dict[str, Any]:
        """How to read this backend's refusal messages (which errno means "the sandbox")."""
        policy, backend = self.policy, self.backend
        if self.overlays:
            # A git directory is a mount here: renaming or removing it is refused too, and so
            # is renaming a directory leading to a nested one (pinned).
            names = [*policy.protected_paths, ".git"]
            for root in policy.all_writable_roots():
                for overlay in self.overlays:
                    if overlay.gitdir != os.path.join(root, ".git") and within(
                        overlay.gitdir, root
                    ):
                        nested = os.path.relpath(overlay.gitdir, root)
                        names += [nested, *_leading_dirs(os.path.dirname(nested))]
            policy = policy.model_copy(update={"protected_paths": tuple(dict.fromkeys(names))})
        context: dict[str, Any] = {"policy": policy, "workdir": self._spec.workdir}
        guarded = self._guarded
        if guarded is not None:
            context["guarded"] = guarded  # what the installed hooks run, the cache homes
        if backend.write_refusals is not None:
            context["write_refusals"] = backend.write_refusals
        if backend.scratch_is_private_tmpdir:
            context["scratch_dirs"] = (self._private_tmpdir,)
        return context


def _content(path: str) -> bytes | None:
    try:
        return read_regular(path, 1 << 21, follow=False)
    except OSError:
        return None


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _leading_dirs(relative: str) -> list[str]:
    """``a``, ``a/b``, ``a/b/c`` for ``a/b/c`` (nothing for ``.`` or empty)."""
    if relative in ("", "."):
        return []
    parts = relative.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class _Idempotent:
    """A release that may come early (`ConfinedSpawn._release_early`) and again from the
    stack: only the first call acts."""

    def __init__(self, call: Callable[[], None]) -> None:
        self._call: Callable[[], None] | None = call

    def __call__(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call()


class _Once:
    """A call a pool thread makes once, letting go of its target before the result is set.

    A pool's worker holds its work item until the next one arrives, after the awaiter has
    woken: that reference would keep this spawn, and through it the executor, alive past
    `run()`, so an executor dropped without `aclose` would not be collected (its finalizer
    is what frees the network namespace and the proxy)."""

    def __init__(self, call: Callable[[], None]) -> None:
        self._call: Callable[[], None] | None = call

    def __call__(self) -> None:
        call, self._call = self._call, None
        assert call is not None, "called twice"
        call()
