"""`SandboxBashExecutor`: the local executor with every confined spawn owned by a scope.

It stamps a complete policy on each spec in `resolve()`; for each spawn it chooses the
backend and prepares the executor's namespaces off the event loop, then opens a
`ConfinedSpawn` (confined_spawn.py), which acquires every stage of the spawn and releases
them, reads the outcome and the facts. What all spawns share is one `SandboxServices`
(services.py). `danger-full-access` never reaches a backend: the spawn is exactly the local
executor's. When confinement cannot be guaranteed, it raises `SandboxUnavailableError`
before anything runs; it never falls back to an unconfined run.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bash_local.config import LocalBashConfig
from bash_local.executor import LocalBashExecutor
from bash_local.output import OutputListener
from bash_local.spawn import SpawnScope, UnconfinedSpawn
from bash_sandbox.backends.base import SandboxBackend
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.confined_spawn import ConfinedSpawn, SpawnSettings
from bash_sandbox.egress_guards import credential_files
from bash_sandbox.errors import SandboxUnavailableError, ViewChangedError
from bash_sandbox.loop_turns import LoopLock, give_way
from bash_sandbox.publish import Publication, PublishError, open_publication
from bash_sandbox.selection import BackendSelector, candidate_backends
from bash_sandbox.services import SandboxServices
from bash_sandbox.workdir_access import check_enterable
from bash_seam import (
    BashExecRequest,
    BashExecSpec,
    BashProcess,
    BashRunResult,
    SandboxFacts,
    WorkdirError,
)
from policies import NetworkMode, SandboxMode, SandboxPolicy
from policies.paths import within_any
from policies.service import SandboxPolicyService

if TYPE_CHECKING:
    from bash_sandbox.egress import Resolver


class _DangerSpawn(UnconfinedSpawn):
    """danger-full-access: exactly the local executor's spawn, with facts saying so."""

    def __init__(self, plan: Any, mode: SandboxMode) -> None:
        super().__init__(plan)
        self._mode = mode

    async def settled(self, outcome: Any) -> SandboxFacts | None:
        return SandboxFacts(
            mode=self._mode, denied=False, enforcement=None, backend=None, network=NetworkMode.HOST
        )


# Views taken per run when a covered path keeps vanishing before the mount (executors closing).
_VIEW_ATTEMPTS = 3


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
            unprotected_paths=cfg.unprotected_paths,
        )
        self._services = SandboxServices(cfg, egress_resolver=egress_resolver)
        # An executor dropped without aclose() still frees its namespaces, cgroups, proxy,
        # cover watch and state.
        self._finalizer = weakref.finalize(self, self._services.close)
        self._selector = BackendSelector(
            candidate_backends(
                cfg.backend,
                runner_command=tuple(cfg.runner_command),
                runner_failure_signatures=tuple(cfg.runner_failure_signatures),
            ),
            cfg.probe_timeout_ms,
        )
        self._prepared: set[SandboxMode] = set()
        self._turns = LoopLock()

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
                # A credential's source file is never readable by a command.
                "deny_read": (*policy.deny_read, *credential_files(cfg.credentials)),
                "protect_hook_chain": cfg.protect_hook_chain,
            }
        )

    def _policy_of(self, spec: BashExecSpec) -> SandboxPolicy:
        if spec.sandbox_policy is not None:
            return spec.sandbox_policy
        # A hand-built spec without a policy gets the executor's default, never none.
        root = self.config.workspace_root or spec.workdir
        return self._with_config(self._service.resolve(cwd=root))

    # -- one scope per spawn -----------------------------------------------------------------

    async def _open_scope(self, spec: BashExecSpec) -> SpawnScope:
        policy = self._policy_of(spec)
        if not policy.confined:
            # Exactly the local executor's: no placeholder kept for a next confined command.
            self._services.survey.let_go()
            return _DangerSpawn(self._base_plan(spec), policy.mode)
        check_enterable(spec.workdir)  # a request error, not the host's (`workdir_access`)
        if policy.mode in self._prepared:
            backend = self._prepare(policy.mode)
        else:
            # Probing forks and waits, and so does making the namespaces: in a thread, so
            # other tasks (and the CLI's signal handling) keep running meanwhile.
            backend = await asyncio.to_thread(self._prepare, policy.mode)
            self._prepared.add(policy.mode)
        settings = self._spawn_settings()
        # One spawn prepares at a time, in turns (`loop_turns.py`): several ready at once
        # would each run their work before the loop's other tasks did.
        async with self._turns.lock():
            await give_way()
            return await ConfinedSpawn.open(
                self._services,
                spec,
                self._base_plan(spec),
                policy=policy,
                backend=backend,
                settings=settings,
            )

    def _spawn_settings(self) -> SpawnSettings:
        cfg = self.config
        return SpawnSettings(
            allow_domains=tuple(cfg.allow_domains),
            tool_caches=cfg.tool_caches,
            degraded=self._selector.degraded,
            credentials=cfg.credentials,
            hosts_file=cfg.hosts_file,
            collect_evidence=self._collect_evidence,
        )

    def warm(self, spec: BashExecSpec) -> None:
        """Do now, blocking, what the first spawn of ``spec`` (a resolved request) computes
        once and keeps, as far as it makes nothing the host sees (`ConfinedSpawn.warm`: the
        cache home, the environment's settings, the survey's read-only part); `prepare`
        first. For the warm CLI's spare, in the thread that runs the executor's loop, with no
        spawn in progress."""
        policy = self._policy_of(spec)
        if not policy.confined:
            return
        backend = self._prepare(policy.mode)
        self._prepared.add(policy.mode)
        ConfinedSpawn.warm(
            self._services, spec, policy=policy, backend=backend, settings=self._spawn_settings()
        )

    def prepare(self, mode: SandboxMode | None = None) -> None:
        """Do now, blocking, the one-time work the first confined spawn in ``mode`` (default:
        the executor's) would do: choose the backend (its probe), make the namespaces and
        the supervisor. For a caller that knows a command is coming and has time before it
        (the warm CLI's spare); raises `SandboxUnavailableError` as that spawn would."""
        mode = self.sandbox_mode if mode is None else mode
        if mode is SandboxMode.DANGER_FULL_ACCESS or mode in self._prepared:
            return
        self._prepare(mode)
        self._prepared.add(mode)

    def _prepare(self, mode: SandboxMode) -> SandboxBackend:
        backend = self._selector.choose(mode)
        self._services.prepare(mode, backend)
        return backend

    async def run(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashRunResult:
        try:
            for _ in range(_VIEW_ATTEMPTS - 1):
                try:
                    return await super().run(spec, on_output=on_output)
                except ViewChangedError:
                    # A path the view covers vanished between the survey and the child's
                    # mount (a directory removed meanwhile): nothing ran; look again.
                    continue
            return await super().run(spec, on_output=on_output)
        except SandboxUnavailableError:
            self._selector.distrust_cached()  # if a cached verdict chose the backend
            raise

    async def start(
        self,
        spec: BashExecSpec,
        *,
        on_output: OutputListener | None = None,
        publish: Sequence[int] = (),
    ) -> BashProcess:
        """``publish``: sandbox ports reachable from the host while the task runs
        (`bash_sandbox.publish`); their URLs are `published(process.id)`."""
        publication = await self.publish(publish, spec) if publish else None
        try:
            process = await super().start(spec, on_output=on_output)
        except BaseException as exc:
            if publication is not None:
                publication.close()
            if isinstance(exc, SandboxUnavailableError):
                self._selector.distrust_cached()
            raise
        if publication is not None:
            self._services.publications.track(
                process.id, publication, asyncio.ensure_future(process.wait())
            )
        return process

    async def publish(self, ports: Sequence[int], spec: BashExecSpec) -> Publication:
        """Publish ``ports`` of the network ``spec``'s command gets, until the caller closes
        the publication (`start(publish=...)` ties it to the task). Raises `PublishError`."""
        self._services.publications.check_room()
        policy = self._policy_of(spec)
        own_network = policy.confined and policy.network is NetworkMode.ISOLATED
        namespaces = None
        if own_network:
            backend = await asyncio.to_thread(self._prepare, policy.mode)
            if backend.mounts:
                # The loopback of the call's trust domain: where its server listens.
                namespaces = await asyncio.to_thread(self._services.domain_namespaces, policy)
        if own_network and namespaces is None:
            raise PublishError("publish: this backend gives commands no network namespace")
        return await asyncio.to_thread(
            open_publication,
            ports,
            namespaces,
            host=self.config.publish_host,
            same_port=self.config.publish_same_port,
        )

    def published(self, process_id: str) -> dict[int, str]:
        """The host URL of each port published for the task ``process_id`` (empty once it
        settled, or when none was)."""
        return self._services.publications.urls(process_id)

    # -- lifetime ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await super().aclose()
        await self._services.aclose()
        self._finalizer()
