"""`SandboxBashExecutor`: the local executor with every confined spawn wrapped by a backend.

It stamps a complete policy on each spec in `resolve()`, prepares the backend and its own
namespaces off the event loop (`_prepare`), builds the host view and wraps the spawn in
`_confine()`, hands the command's supervised syscalls to its seccomp supervisor
(`_after_spawn`), merges the git overlays back and collects the evidence (`_after_settle`),
and reads the outcome in `_outcome_facts()`. `danger-full-access` never reaches a backend:
the spawn is exactly the local executor's. When confinement cannot be guaranteed, it raises
`SandboxUnavailableError` before anything runs; it never falls back to an unconfined run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import re
import socket
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from bash_local.config import LocalBashConfig
from bash_local.environment import build_command_env
from bash_local.executor import LocalBashExecutor
from bash_local.output import OutputListener
from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.base import (
    BackendContext,
    ConfinedPlan,
    SandboxBackend,
)
from bash_sandbox.backends.mount_plan import (
    GitOverlay,
    HostView,
    inspect_protected,
    tmp_tops,
    visible,
    within,
    within_any,
)
from bash_sandbox.backends.shadow_cache import ShadowCache
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.environment import sandbox_inherited_env
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.facts import (
    DENIALS_LIMIT,
    bounded_denials,
    derive_facts_flags,
    infer_file_denials,
)
from bash_sandbox.git_plane import (
    MergeReport,
    config_path_targets,
    merge_back,
    prepare_placeholders,
)
from bash_sandbox.git_spawn import GitInspection, inspect_git, settle_git
from bash_sandbox.linux.cover_watch import CoverWatch, CoverWatchError, WatchTicket
from bash_sandbox.linux.limits import ExecutorLimits, LimitsPlan, LimitsSetupError
from bash_sandbox.linux.namespaces import ExecutorNamespaces, NamespaceError
from bash_sandbox.linux.supervisor import (
    ConnectPolicy,
    SeccompSupervisor,
    SupervisedCommand,
    identity,
    receive_listener,
)
from bash_sandbox.placeholders import Placeholders
from bash_sandbox.selection import BackendSelector, candidate_backends
from bash_sandbox.state import ExecutorState, remove_tree
from bash_sandbox.tool_env import confined_environment, tool_cache_home
from bash_seam import (
    BashExecRequest,
    BashExecSpec,
    BashProcess,
    BashRunResult,
    SandboxDenial,
    SandboxFacts,
    WorkdirError,
)
from policies import (
    LimitExceeded,
    NetworkMode,
    SandboxEnforcement,
    SandboxMode,
    SandboxPolicy,
    host_secrets,
)
from policies.service import SandboxPolicyService

if TYPE_CHECKING:
    # The proxy (h11, its resolver) is loaded only by a policy with an allowlist.
    from bash_sandbox.egress import EgressProxy, ProxyGrant, Resolver

MAX_DENIALS = 16
# A path the view mounts vanished between inspecting the host and the child mounting it
# (or bwrap's own wording, for a bwrap that mounts the view itself).
_VANISHED = re.compile(
    r"child setup failed at (bind|remount-ro|setattr|mkdir|create) .*: "
    r"No such file or directory"
    r"|^bwrap: Can't (mkdir|mkdir parents for|get type of source|find source path) ",
    re.M,
)


@dataclass
class _SpawnRecord:
    """What happened to one confined spawn, filled in as it goes."""

    supervised: SupervisedCommand | None = None
    grant: ProxyGrant | None = None
    limits: LimitsPlan | None = None
    placeholders: tuple[str, ...] = ()
    overlays: tuple[GitOverlay, ...] = ()  # their upper directories, removed on release
    limit_exceeded: LimitExceeded | None = None
    merges: list[MergeReport] = field(default_factory=list)
    nested: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)
    watch: WatchTicket | None = None
    git: GitInspection | None = None
    settled: bool = False
    released: bool = False


@dataclass(frozen=True)
class SandboxSpawn(ConfinedPlan):
    """A confined plan plus what the executor decided for it and reads back later."""

    policy: SandboxPolicy | None = None
    backend: SandboxBackend | None = None
    enforcement: SandboxEnforcement = SandboxEnforcement.FULL
    started_ns: int = 0
    overlays: tuple[GitOverlay, ...] = ()
    listener_socket: socket.socket | None = None
    cache_home: str | None = None
    record: _SpawnRecord = field(default_factory=_SpawnRecord, compare=False)


def _resolv_nameservers() -> frozenset[str]:
    try:
        with open("/etc/resolv.conf") as fh:
            lines = fh.read(65536).splitlines()
    except OSError:
        return frozenset()
    return frozenset(
        parts[1]
        for parts in (line.split() for line in lines)
        if len(parts) > 1 and parts[0] == "nameserver"
    )


def _cleanup(
    state: ExecutorState,
    namespaces: ExecutorNamespaces,
    *,
    supervisor: list[SeccompSupervisor],
    limits: ExecutorLimits,
    proxies: list[EgressProxy],
    watches: list[CoverWatch],
) -> None:
    for watch in watches:
        watch.close()
    for proxy in proxies:
        # Its thread holds the listener, which holds the network namespace. Called on that
        # very thread (a collection there), close() stops the loop but cannot join it.
        with contextlib.suppress(RuntimeError):
            proxy.close()
    for sup in supervisor:
        sup.close()
    limits.close()
    namespaces.close()
    state.remove()


class SandboxBashExecutor(LocalBashExecutor):
    """Confines every command under the configured (or per-request) policy."""

    config_type: ClassVar[type[LocalBashConfig]] = SandboxBashConfig
    config: SandboxBashConfig
    # Private, for `scripts/bench-facts` only: False skips the evidence work after each
    # command (nested-repository detection, output inference) to measure its cost. The
    # confinement, the supervisor and the git copy-back run either way.
    _collect_evidence: bool = True

    def __init__(
        self,
        config: SandboxBashConfig | None = None,
        *,
        egress_resolver: Resolver | None = None,
        **overrides: Any,
    ) -> None:
        """``egress_resolver`` replaces the host's name resolution for the egress proxy
        (tests map test host names to their own servers); ``overrides`` are config fields."""
        super().__init__(config if config is not None else SandboxBashConfig(), **overrides)
        cfg = self.config
        self._service = SandboxPolicyService(
            cfg.mode,
            cfg.workspace_root,
            cfg.network,
            writable_roots=cfg.writable_roots,
            protected_paths=cfg.protected_paths,
            deny_read=cfg.deny_read,
        )
        configured = tuple(
            os.path.realpath(r) for r in (*cfg.writable_roots, cfg.workspace_root or "/nonexistent")
        )
        self._state = ExecutorState(configured)
        self._namespaces = ExecutorNamespaces(
            self._state.scratch, tmp_bytes=cfg.limits.tmp_bytes, shm_bytes=cfg.limits.shm_bytes
        )
        self._supervisors: list[SeccompSupervisor] = []
        self._limits = ExecutorLimits()
        self._proxies: list[EgressProxy] = []  # at most one, made by the first allowlist
        self._spawn_ids = itertools.count(1)
        self._watches: list[CoverWatch] = []  # at most one, made by the first watched cover
        # An executor dropped without aclose() still frees its namespaces, cgroups, proxy,
        # cover watch and state.
        self._finalizer = weakref.finalize(
            self,
            _cleanup,
            self._state,
            self._namespaces,
            supervisor=self._supervisors,
            limits=self._limits,
            proxies=self._proxies,
            watches=self._watches,
        )
        self._selector = BackendSelector(
            candidate_backends(
                cfg.backend,
                runner_command=tuple(cfg.runner_command),
                runner_failure_signatures=tuple(cfg.runner_failure_signatures),
            ),
            cfg.probe_timeout_ms,
        )
        self._prepared = False
        self._nameservers = _resolv_nameservers()
        self._egress_resolver = egress_resolver
        self._placeholders = Placeholders()
        self._shadows = ShadowCache()
        # `.git` entries found by earlier spawns, looked at again by every later one.
        self._known_dotgits: dict[str, None] = {}

    @property
    def sandbox_mode(self) -> SandboxMode:
        return self.config.mode

    @property
    def policy_service(self) -> SandboxPolicyService:
        return self._service

    @property
    def selector(self) -> BackendSelector:
        return self._selector

    def probes(self) -> list[Any]:
        """The functional probe of each candidate backend (cached after the first call)."""
        return self._selector.probes()

    # -- resolve: stamp the policy, place the workdir ------------------------------------

    def resolve(self, request: BashExecRequest) -> BashExecSpec:
        if request.workdir is None:
            # The default workdir is the workspace root, not the harness's own cwd.
            root = self.config.workspace_root or self.config.cwd
            if root is not None:
                request = request.model_copy(update={"workdir": root})
        spec = super().resolve(request)
        policy = request.sandbox_policy
        if policy is None:
            root = self.config.workspace_root or spec.workdir
            policy = self._with_config(self._service.resolve(mode=request.sandbox_mode, cwd=root))
        if policy.confined:
            roots = (policy.workspace_root, *policy.writable_roots)
            if not within_any(os.path.realpath(spec.workdir), roots):
                raise WorkdirError(
                    f"workdir {spec.workdir!r} is outside the workspace {policy.workspace_root!r} "
                    "and every writable root: pass a workdir inside them"
                )
        return spec.model_copy(update={"sandbox_policy": policy})

    def _with_config(self, policy: SandboxPolicy) -> SandboxPolicy:
        """The service's policy plus what only the executor's config knows."""
        cfg = self.config
        return policy.model_copy(
            update={
                "limits": cfg.limits,
                "allow_domains": tuple(cfg.allow_domains),
                "allow_unix_sockets": tuple(cfg.allow_unix_sockets),
                "protect_hook_chain": cfg.protect_hook_chain,
            }
        )

    def _policy_of(self, spec: BashExecSpec) -> SandboxPolicy:
        if spec.sandbox_policy is not None:
            return spec.sandbox_policy
        # A hand-built spec without a policy gets the executor's default, never none.
        root = self.config.workspace_root or spec.workdir
        return self._with_config(self._service.resolve(cwd=root))

    async def run(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashRunResult:
        try:
            try:
                return await super().run(spec, on_output=on_output)
            except SandboxUnavailableError as exc:
                # A directory the view covers vanished between inspecting the host and the
                # child mounting it (another executor's spill dir removed meanwhile): nothing
                # ran; look at the host again, once.
                if not _VANISHED.search(exc.detail):
                    raise
                return await super().run(spec, on_output=on_output)
        except SandboxUnavailableError:
            self._selector.distrust_cached()  # if a cached verdict chose the backend
            raise

    async def start(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashProcess:
        try:
            return await super().start(spec, on_output=on_output)
        except SandboxUnavailableError:
            self._selector.distrust_cached()
            raise

    # -- prepare: probes and namespaces, off the event loop ------------------------------

    async def _prepare(self, spec: BashExecSpec) -> None:
        if self._prepared or not self._policy_of(spec).confined:
            return
        # Probing forks and waits, and so does making the namespaces: in a thread, so other
        # tasks (and the CLI's signal handling) keep running meanwhile.
        await asyncio.to_thread(self._prepare_blocking, self._policy_of(spec).mode)
        self._prepared = True

    def _prepare_blocking(self, mode: SandboxMode) -> None:
        backend = self._selector.choose(mode)
        if backend.mounts:
            try:
                self._namespaces.fds()
            except NamespaceError as exc:
                raise SandboxUnavailableError(
                    mode, f"cannot make the executor's namespaces: {exc}"
                ) from exc
        if not self._supervisors:
            self._supervisors.append(SeccompSupervisor())

    # -- confine the spawn -----------------------------------------------------------------

    def _view(
        self, policy: SandboxPolicy, backend: SandboxBackend, user_policy: SandboxPolicy
    ) -> tuple[HostView, tuple[str, ...], GitInspection | None]:
        """Inspect the host for one spawn: overlays, protected names, shadows, covers; and
        the host placeholders this spawn now holds (released when it settles)."""
        partial: list[str] = []
        held: list[str] = []
        roots = policy.all_writable_roots()
        hidden = self._state.hidden_paths()
        if not backend.mounts:
            return HostView(hidden=hidden), (), None
        private_tmp = True
        tops = tmp_tops((policy.workspace_root, *roots))
        # The user's roots: the sandbox's own cache home has no git dir or protected names.
        git = inspect_git(user_policy, known=tuple(self._known_dotgits))
        self._known_dotgits.update(dict.fromkeys(git.discovery.dotgits))
        gitdirs = git.gitdirs
        # A search cut short: a repository it did not reach has a writable control plane.
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
            overlays.append(GitOverlay(gitdir, upper.upper, upper.work, made))
        # A missing protected name outside git: a placeholder of the right kind, covered,
        # removed once no command of this uid needs it (`placeholders.py`).
        for path, is_dir in protected.missing:
            if self._placeholders.acquire(path, is_dir):
                held.append(path)
            covers.append(path)
        if protected.symlinked:
            partial.append("a protected name is a symlink inside a writable root")
        # Hooks paths and included configs inside a root run or configure the host's git.
        for path, is_dir in [*self._git_config_targets(gitdirs, roots), *git.chain_targets]:
            if os.path.lexists(path):
                covers.append(os.path.realpath(path))
            elif self._placeholders.acquire(path, is_dir):
                held.append(path)
                covers.append(path)
        # The host's own secrets stay hidden whatever the policy's deny_read says.
        denied = (*policy.deny_read, *host_secrets())
        shadows, deny_dirs, deny_files = self._shadows.inspect(denied, roots)
        # The executor's private paths are its own directories: covered, never shadowed.
        for path in hidden:
            if os.path.isdir(path) and not os.path.islink(path):
                deny_dirs = (*deny_dirs, path)
        deny_dirs = tuple(p for p in deny_dirs if visible(p, tops, private_tmp))
        deny_files = tuple(p for p in deny_files if visible(p, tops, private_tmp))
        shadows = tuple(s for s in shadows if visible(s.directory, tops, private_tmp))
        # What a host rename or delete would uncover while the command runs: every name
        # covered where it lies, and every denied name missing outside the shadows.
        watched = [p for p in (*deny_dirs, *deny_files) if p not in hidden]
        watched += [c for c in covers if not within_any(c, gitdirs)]
        for path in denied:
            name = os.path.normpath(path)
            if (
                not os.path.lexists(name)
                and not any(within(name, s.directory) for s in shadows)
                and visible(name, tops, private_tmp)
            ):
                watched.append(name)
        view = HostView(
            shadows=shadows,
            tmp_tops=tops,
            overlays=tuple(overlays),
            pins=(*protected.pins, *git.pins(roots)),
            protect=tuple(dict.fromkeys(covers)),
            deny_dirs=deny_dirs,
            deny_files=deny_files,
            hidden=hidden,
            partial=tuple(partial),
            watched=tuple(dict.fromkeys(watched)),
        )
        return view, tuple(held), git

    @staticmethod
    def _git_config_targets(
        gitdirs: tuple[str, ...], roots: tuple[str, ...]
    ) -> list[tuple[str, bool]]:
        """`core.hooksPath` and `include`/`includeIf` targets inside a writable root, with
        whether each is a directory (hooks) or a file (a config)."""
        home = os.path.expanduser("~")
        found: dict[str, bool] = {}
        for gitdir in gitdirs:
            worktree = os.path.dirname(gitdir)
            hooks, includes = config_path_targets(gitdir, worktree, home)
            for path in hooks:
                if within_any(os.path.realpath(path), roots):
                    found.setdefault(path, True)
            for path in includes:
                if within_any(os.path.realpath(path), roots):
                    found.setdefault(path, False)
        return list(found.items())

    def _confine(self, spec: BashExecSpec, plan: SpawnPlan) -> SpawnPlan:
        policy = self._policy_of(spec)
        if not policy.confined:
            return plan  # danger-full-access: exactly the local executor's spawn
        backend = self._selector.choose(policy.mode)
        self._state.check(policy)
        self._check_binaries(policy, backend)
        self._check_egress(policy, backend)
        namespaces = self._namespaces.ready if backend.mounts else None
        if backend.mounts and namespaces is None:
            # _prepare runs before every spawn; a hand-driven _launch may skip it.
            self._prepare_blocking(policy.mode)
            namespaces = self._namespaces.ready
        if not self._supervisors:
            self._supervisors.append(SeccompSupervisor())
        cache_home: str | None = None
        cache_warning: str | None = None
        user_policy = policy
        if policy.mode is SandboxMode.WORKSPACE_WRITE and self.config.tool_caches:
            # The sandbox's own cache home is writable like a root, for this spawn only.
            cache_home = tool_cache_home()
            if cache_home is None:
                cache_warning = (
                    "no tool cache home under ~/.cache (not writable): package caches "
                    "live in this call's private /tmp"
                )
            else:
                policy = policy.model_copy(
                    update={"writable_roots": (*policy.writable_roots, cache_home)}
                )
        started_ns = time.time_ns()
        view, held, git = self._view(policy, backend, user_policy)
        # Everything this spawn holds from here on, released once whatever happens.
        record = _SpawnRecord(placeholders=held, overlays=view.overlays, git=git)
        try:
            view = self._watch_covers(view, record)
            return self._confine_with(
                spec,
                plan,
                policy=policy,
                backend=backend,
                view=view,
                record=record,
                started_ns=started_ns,
                cache_home=cache_home,
                cache_warning=cache_warning,
            )
        except BaseException:
            self._release(record)
            raise

    def _watch_covers(self, view: HostView, record: _SpawnRecord) -> HostView:
        """Watch the names this spawn covers where they lie (`linux/cover_watch.py`): the
        command is stopped if the host replaces one while it runs. Set before the spawn,
        on the loop thread, so no event can be read between the spawn and `_live`."""
        if not view.watched:
            return view
        try:
            if not self._watches:
                watch = CoverWatch()
                asyncio.get_running_loop().add_reader(watch.fd, watch.read_events)
                self._watches.append(watch)
            record.watch = self._watches[0].watch(
                view.watched, lambda name: self._cover_replaced(record, name)
            )
        except (CoverWatchError, RuntimeError) as exc:
            why = f"covers are not watched ({exc}): a host change of a covered name uncovers it"
            return dataclasses.replace(view, partial=(*view.partial, why))
        return view

    def _cover_replaced(self, record: _SpawnRecord, name: str) -> None:
        """The host changed a name this running command covers: it is stopped now."""
        record.warnings.append(
            f"stopped: the host replaced or removed {name}, which this command had covered, "
            "while it ran (a replaced name is no longer covered); run it again"
        )
        for spawned in list(self._live):
            if getattr(spawned.plan, "record", None) is record:
                spawned.kill_now()

    def _confine_with(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        policy: SandboxPolicy,
        backend: SandboxBackend,
        view: HostView,
        record: _SpawnRecord,
        started_ns: int,
        cache_home: str | None,
        cache_warning: str | None,
    ) -> SandboxSpawn:
        """The rest of `_confine` once the view is taken: the egress grant, the
        environment, the limits and the backend's plan, each recorded as it is taken."""
        namespaces = self._namespaces.ready if backend.mounts else None
        grant = record.grant = self._egress_grant(policy, backend)
        env = confined_environment(
            build_command_env(sandbox_inherited_env(os.environ), spec.env, spec.dsh_env),
            policy,
            private_tmp=backend.mounts,
            cache_home=cache_home,
            proxy_env=grant.environment() if grant is not None else None,
            request_env=spec.env,
        )
        try:
            limits = record.limits = self._limits.prepare(
                f"spawn-{next(self._spawn_ids)}",
                policy.limits,
                own_user_namespace=backend.name != "landlock",
            )
        except LimitsSetupError as exc:
            raise SandboxUnavailableError(policy.mode, str(exc)) from exc
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        ctx = BackendContext(
            sources=self._state.sources,
            view=view,
            namespaces=namespaces,
            scratch=self._state.scratch if backend.mounts else None,
            stage=self._state.stage,
            private_tmpdir=self._state.private_tmpdir,
            listener_fd=theirs.fileno(),
            limits=limits,
        )
        try:
            confined = backend.wrap(policy, dataclasses.replace(plan, env=env), ctx)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        inner_release = confined.release

        def release() -> None:
            theirs.close()
            if inner_release is not None:
                inner_release()

        enforcement = backend.enforcement(policy)
        if view.partial:
            enforcement = SandboxEnforcement.PARTIAL
        record.warnings += self._limits.warnings
        if self._selector.degraded:
            record.warnings.append(self._selector.degraded)
        record.warnings += list(view.partial)
        if cache_warning is not None:
            record.warnings.append(cache_warning)
        fields = {f.name: getattr(confined, f.name) for f in dataclasses.fields(ConfinedPlan)}
        fields["release"] = release
        return SandboxSpawn(
            **fields,
            policy=policy,
            backend=backend,
            enforcement=enforcement,
            started_ns=started_ns,
            overlays=view.overlays,
            listener_socket=ours,
            cache_home=cache_home,
            record=record,
        )

    def _check_egress(self, policy: SandboxPolicy, backend: SandboxBackend) -> None:
        """Refuse, before anything is acquired for the spawn, an allowlist this executor
        cannot enforce."""
        if policy.network is not NetworkMode.ISOLATED or not backend.mounts:
            return
        # Every command in the namespace can reach the proxy, which serves requests without a
        # grant token under the executor's list: a per-call list without all of it (or none)
        # cannot be enforced, so it is refused rather than silently widened.
        missing = [e for e in self.config.allow_domains if e not in policy.allow_domains]
        if missing:
            raise SandboxUnavailableError(
                policy.mode,
                f"this call's allow_domains {list(policy.allow_domains)} lacks the executor's "
                f"{missing}, and the executor's proxy serves requests without a grant token "
                "under the executor's list: keep the executor's entries in a per-call "
                "allowlist, or use an executor configured with the narrower list",
            )

    def _egress_grant(self, policy: SandboxPolicy, backend: SandboxBackend) -> ProxyGrant | None:
        """Under `isolated` with an allowlist: this command's grant on the executor's proxy,
        which listens inside the executor's network namespace and is its only way out."""
        if policy.network is not NetworkMode.ISOLATED or not policy.allow_domains:
            return None
        ns = self._namespaces.ready
        if ns is None or not backend.mounts:
            raise SandboxUnavailableError(
                policy.mode, "an allowlist needs the executor's network namespace (none here)"
            )
        if not self._proxies:
            from bash_sandbox.egress import EgressProxy, EgressProxyError

            listener = socket.socket(fileno=os.dup(ns.listener))
            proxy = EgressProxy(
                listener, allow=tuple(self.config.allow_domains), resolver=self._egress_resolver
            )
            try:
                proxy.start()
            except EgressProxyError as exc:
                proxy.close()  # never kept: the next call tries a fresh one
                raise SandboxUnavailableError(policy.mode, str(exc)) from exc
            self._proxies.append(proxy)
        return self._proxies[0].register(policy.allow_domains)

    def _check_binaries(self, policy: SandboxPolicy, backend: SandboxBackend) -> None:
        path = getattr(backend, "path", None)
        if isinstance(path, str) and within_any(
            os.path.realpath(path), policy.all_writable_roots()
        ):
            raise SandboxUnavailableError(
                policy.mode,
                f"the {backend.name} binary {path} lies inside a writable root: "
                "a command could replace it",
            )

    def _connect_policy(self, spawn: SandboxSpawn) -> ConnectPolicy:
        policy = spawn.policy
        assert policy is not None
        dirs = [identity(root) for root in policy.all_writable_roots()]
        devices: list[int] = []
        ns = self._namespaces.ready
        if ns is not None and spawn.backend is not None and spawn.backend.mounts:
            devices = [os.fstat(fd).st_dev for fd in (ns.tmp, ns.shm)]
        else:
            dirs.append(identity(self._state.private_tmpdir))
        sockets = [identity(p) for p in policy.allow_unix_sockets if not p.startswith("@")]
        names = [p[1:].encode() for p in policy.allow_unix_sockets if p.startswith("@")]
        # Loopback and abstract names are the command's own only in the executor's private
        # network namespace; under the host network they are the host's.
        private = (
            policy.network is NetworkMode.ISOLATED
            and spawn.backend is not None
            and spawn.backend.network_namespace != "none"
        )
        return ConnectPolicy(
            isolated=policy.network is NetworkMode.ISOLATED,
            private_loopback=private,
            socket_dirs=frozenset(d for d in dirs if d is not None),
            socket_devices=frozenset(devices),
            sockets=frozenset(s for s in sockets if s is not None),
            abstract_names=frozenset(names),
            nameservers=self._nameservers,
        )

    def _after_spawn(self, spec: BashExecSpec, plan: SpawnPlan) -> None:
        if not isinstance(plan, SandboxSpawn) or plan.listener_socket is None:
            return
        sock = plan.listener_socket
        try:
            listener = receive_listener(sock)
        except OSError as exc:
            raise SandboxUnavailableError(
                plan.policy.mode if plan.policy else "read-only",
                f"the sandboxed command did not hand over its seccomp listener: {exc}",
            ) from exc
        finally:
            sock.close()
        plan.record.supervised = self._supervisors[0].register(listener, self._connect_policy(plan))

    def _spawn_error(self, spec: BashExecSpec, plan: SpawnPlan, exc: BaseException) -> Exception:
        if not isinstance(plan, SandboxSpawn) or plan.backend is None or plan.policy is None:
            return super()._spawn_error(spec, plan, exc)
        if plan.listener_socket is not None:
            plan.listener_socket.close()
        self._release(plan.record)
        plan.record.settled = True  # nothing ran: no facts, no merge-back
        detail = plan.backend.explain_failure(plan, exc)
        return SandboxUnavailableError(
            plan.policy.mode, f"{plan.backend.name} could not start: {detail}"
        )

    # -- after the command ------------------------------------------------------------------

    def _after_settle(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str,
    ) -> None:
        if not isinstance(plan, SandboxSpawn) or plan.record.settled:
            return
        record = plan.record
        record.settled = True
        if record.limits is not None:
            # The counters live in the command's cgroup: read them before releasing it.
            ns = self._namespaces.ready
            record.limit_exceeded = self._limits.outcome(
                record.limits,
                exit_code=exit_code,
                signal=signal,
                stderr_text=stderr_text,
                tmp_root=ns.tmp if ns is not None else None,
                shm_root=ns.shm if ns is not None else None,
            )
        if record.supervised is not None and self._supervisors:
            self._supervisors[0].unregister(record.supervised)
        policy = plan.policy
        assert policy is not None
        if (
            policy.mode is SandboxMode.WORKSPACE_WRITE
            and plan.backend is not None
            and plan.backend.mounts
        ):
            # The sandbox's own cache home holds tools' git checkouts (cargo): not the user's.
            roots = tuple(r for r in policy.all_writable_roots() if r != plan.cache_home)
            nested: list[str] = []
            if record.git is not None:
                settled = settle_git(record.git, roots, plan.overlays)
                nested, record.warnings = settled.nested, record.warnings + settled.warnings
            for overlay in plan.overlays:
                report = merge_back(overlay, plan.started_ns)
                record.merges.append(report)
                nested += [
                    os.path.join(os.path.dirname(overlay.gitdir), p) for p in report.new_gitlinks
                ]
                record.warnings += [f"git: not copied back: {c}" for c in report.conflicts]
            record.nested = tuple(dict.fromkeys(nested))
        self._release(record)

    def _release(self, record: _SpawnRecord) -> None:
        """Give back everything a spawn held: its cgroups, egress grant, host placeholders
        and overlay directories. Once; the record keeps what the facts read (the grant's
        denials, the limits' summary)."""
        if record.released:
            return
        record.released = True
        if record.watch is not None and self._watches:
            self._watches[0].release(record.watch)
        if record.limits is not None:
            self._limits.release(record.limits)
        if record.grant is not None:
            record.grant.close()
        for path in record.placeholders:
            self._placeholders.release(path)
        for overlay in record.overlays:
            remove_tree(os.path.dirname(overlay.upper))

    def _outcome_facts(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str,
        background: bool,
        stdout_text: str = "",
    ) -> SandboxFacts | None:
        if not isinstance(plan, SandboxSpawn) or plan.policy is None or plan.backend is None:
            return SandboxFacts(
                mode=self._policy_of(spec).mode,
                denied=False,
                enforcement=None,
                backend=None,
                network=NetworkMode.HOST,
            )
        policy, backend, record = plan.policy, plan.backend, plan.record
        self._after_settle(spec, plan, exit_code=exit_code, signal=signal, stderr_text=stderr_text)
        failure = backend.runner_failure(exit_code, stderr_text)
        if failure is not None:
            if not background:
                raise SandboxUnavailableError(policy.mode, failure)
            return SandboxFacts(
                mode=policy.mode,
                denied=False,
                enforcement=plan.enforcement,
                runner_failed=True,
                backend=backend.name,
                network=policy.network,
            )
        denials: list[SandboxDenial] = []
        total = 0
        if record.supervised is not None:
            seen, count = record.supervised.snapshot()
            denials += seen
            total += count
        for report in record.merges:
            denials += report.denials
            total += report.refused_total
        if record.grant is not None:
            denials += [d.to_sandbox_denial() for d in record.grant.denials()]
            total += record.grant.denials_total
        inferred = (
            infer_file_denials(
                stdout_text, stderr_text, **self._inference_context(plan, spec.workdir)
            )
            if self._collect_evidence
            else []
        )
        denials += inferred
        total += len(inferred)
        # Evidence wins over an inference about the same target; the list stays bounded.
        first, _ = bounded_denials(denials, DENIALS_LIMIT)
        denied, network_denied = derive_facts_flags(
            first, exit_code, signal, folds_signals=plan.folds_signals
        )
        return SandboxFacts(
            mode=policy.mode,
            denied=denied,
            enforcement=plan.enforcement,
            backend=backend.name,
            network=policy.network,
            network_denied=network_denied,
            denials=tuple(first),
            denials_total=max(total, len(first)),
            nested_repositories=record.nested,
            limit_exceeded=record.limit_exceeded,
            limits_enforcement=record.limits.summary if record.limits is not None else None,
            warnings=tuple(dict.fromkeys(record.warnings)),
        )

    def _inference_context(self, plan: SandboxSpawn, workdir: str) -> dict[str, Any]:
        """How to read this backend's refusal messages (which errno means "the sandbox")."""
        assert plan.policy is not None and plan.backend is not None
        policy = plan.policy
        if plan.overlays:
            # A git directory is a mount here: renaming or removing it is refused too, and so
            # is renaming a directory leading to a nested one (pinned).
            names = [*policy.protected_paths, ".git"]
            for root in policy.all_writable_roots():
                for overlay in plan.overlays:
                    if overlay.gitdir != os.path.join(root, ".git") and within(
                        overlay.gitdir, root
                    ):
                        nested = os.path.relpath(overlay.gitdir, root)
                        names += [nested, *_leading_dirs(os.path.dirname(nested))]
            policy = policy.model_copy(update={"protected_paths": tuple(dict.fromkeys(names))})
        if not plan.backend.mounts and plan.backend.name == "landlock":
            # Landlock alone refuses with EACCES; its only scratch dir is the private TMPDIR.
            return {
                "policy": policy,
                "workdir": workdir,
                "scratch_dirs": (self._state.private_tmpdir,),
                "write_refusals": frozenset({"EROFS", "EACCES"}),
            }
        if plan.backend.name == "seatbelt":
            return {
                "policy": policy,
                "workdir": workdir,
                "write_refusals": frozenset({"EPERM"}),
            }
        guarded = plan.record.git.guarded if plan.record.git is not None else {}
        return {"policy": policy, "workdir": workdir, "guarded": guarded}

    # -- lifetime ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await super().aclose()
        for watch in self._watches:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(watch.fd)
            watch.close()
        for proxy in self._proxies:
            # Joins the proxy's thread: off the loop.
            await asyncio.to_thread(proxy.close)
        self._finalizer()


def _leading_dirs(relative: str) -> list[str]:
    """``a``, ``a/b``, ``a/b/c`` for ``a/b/c`` (nothing for ``.`` or empty)."""
    if relative in ("", "."):
        return []
    parts = relative.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
