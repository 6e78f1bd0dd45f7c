"""`SandboxServices`: what every confined spawn of one executor shares, and its one `close()`.

The executor's namespaces, its private state, its cgroup parents, the seccomp supervisor,
the egress proxy, the cover watch and the repository search's watched tree live as long
as the executor; each is made when a spawn
first needs it (the getters) and given back together by `close()`, which `weakref.finalize`
calls when an executor is dropped without `aclose()`. Nothing here refers back to the
executor, so the finalizer can run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import socket
from typing import TYPE_CHECKING

from bash_sandbox.backends.base import SandboxBackend
from bash_sandbox.backends.view_steps import KeptMountTable
from bash_sandbox.cache_domains import CacheHolds
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.git_tree_watch import GitTreeWatch
from bash_sandbox.host_view import HostSurvey
from bash_sandbox.linux.cover_watch import CoverWatch
from bash_sandbox.linux.helper_client import SpawnHelper, SpawnHelperError
from bash_sandbox.linux.limits import ExecutorLimits
from bash_sandbox.linux.namespaces import ExecutorNamespaces, NamespaceError, NamespaceFds
from bash_sandbox.linux.rlimits import reserve_held_fds
from bash_sandbox.linux.supervisor import SeccompSupervisor
from bash_sandbox.loop_turns import follow_loop
from bash_sandbox.mirrors import Mirrors
from bash_sandbox.publish import Publications
from bash_sandbox.state import ExecutorState, GitUpper
from bash_sandbox.trust_domain import domain_key, executor_reach
from bash_sandbox.view import GitOverlay
from policies import NetworkMode, SandboxMode, SandboxPolicy

if TYPE_CHECKING:
    # The proxy (h11, its resolver) is loaded only by a policy with an allowlist.
    from bash_sandbox.config import SandboxBashConfig
    from bash_sandbox.egress import EgressProxy, ProxyGrant, Resolver


def resolv_nameservers(path: str = "/etc/resolv.conf") -> frozenset[str]:
    try:
        with open(path) as fh:
            lines = fh.read(65536).splitlines()
    except OSError:
        return frozenset()
    return frozenset(
        parts[1]
        for parts in (line.split() for line in lines)
        if len(parts) > 1 and parts[0] == "nameserver"
    )


class SandboxServices:
    """One executor's shared machinery. Not thread-safe: used from the executor's loop
    (and from `asyncio.to_thread` for `prepare`, never concurrently with a spawn)."""

    def __init__(self, config: SandboxBashConfig, *, egress_resolver: Resolver | None) -> None:
        # Before any descriptor of the executor's exists (`rlimits.reserve_held_fds`).
        reserve_held_fds()
        self._config = config
        configured = tuple(
            os.path.realpath(r)
            for r in (*config.writable_roots, config.workspace_root or "/nonexistent")
        )
        self.state = ExecutorState(configured)
        self.namespaces = ExecutorNamespaces(
            self.state.scratch,
            tmp_bytes=config.limits.tmp_bytes,
            shm_bytes=config.limits.shm_bytes,
        )
        self.limits = ExecutorLimits()
        self.mount_table = KeptMountTable()  # read at each spawn, again once it changed
        self.git_tree = GitTreeWatch()  # the repository search, kept current by inotify
        self.survey = HostSurvey(
            self.state,
            self.git_tree.find_dotgits,
            linger_s=config.placeholder_linger_ms / 1000,
        )
        self.nameservers = resolv_nameservers()
        self.spawn_ids = itertools.count(1)
        self.publications = Publications()
        self.mirrors = Mirrors()
        self.cache_holds = CacheHolds()
        self.cache_reach = executor_reach(config)  # part of the shared cache homes' key
        self._egress_resolver = egress_resolver
        self._supervisor: SeccompSupervisor | None = None
        self._proxy: EgressProxy | None = None
        self._proxy_nets: set[int] = set()  # the domains' namespaces the proxy listens in
        self._watch: CoverWatch | None = None
        self._watch_loop: asyncio.AbstractEventLoop | None = None
        self._helper: SpawnHelper | None = None
        self.helper_failure: str | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    # -- lazy getters ----------------------------------------------------------------------

    def prepare(self, mode: SandboxMode, backend: SandboxBackend) -> None:
        """The slow one-time part (forks and waits): the namespaces, the supervisor."""
        if backend.mounts:
            self.namespaces_for(mode)
        self.supervisor()

    def namespaces_for(self, mode: SandboxMode) -> NamespaceFds:
        try:
            return self.namespaces.fds()
        except NamespaceError as exc:
            raise SandboxUnavailableError(
                mode, f"cannot make the executor's namespaces: {exc}"
            ) from exc

    def domain_namespaces(self, policy: SandboxPolicy) -> NamespaceFds:
        """The namespaces ``policy``'s commands join: its trust domain's own loopback, abstract
        sockets and ptys, made the first time the domain spawns (blocking: off the loop
        unless `domain_ready`), kept until `close()`. ``policy``: the caller's, before the
        executor adds its cache home (which follows from it)."""
        try:
            return self.namespaces.for_domain(domain_key(policy))
        except NamespaceError as exc:
            raise SandboxUnavailableError(
                policy.mode, f"cannot make the trust domain's namespaces: {exc}"
            ) from exc

    def domain_ready(self, policy: SandboxPolicy) -> NamespaceFds | None:
        return self.namespaces.domain_ready(domain_key(policy))

    def supervisor(self) -> SeccompSupervisor:
        if self._supervisor is None:
            self._supervisor = SeccompSupervisor()
        return self._supervisor

    def settle_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The executor's own threads for what settles a spawn off the loop (the git import):
        gone with the executor, unlike the loop's default pool."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="bash-sandbox-settle"
            )
        return self._pool

    def recycle_upper(self, overlay: GitOverlay) -> None:
        """Give a spawn's git overlay upper back after its import: kept for the next spawn
        when the command left it empty, else removed (`ExecutorState.recycle_upper`), on the
        settle threads, off the next run's way; removed inline once the executor closes,
        whose state directory takes whatever is still queued."""
        upper = GitUpper(overlay.upper, overlay.work)
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the pool shut down meanwhile
                self.settle_pool().submit(self.state.recycle_upper, upper, overlay.placeholders)
                return
        # Inline: kept out of the state when unimported (`ExecutorState.recycle_upper`).
        self.state.recycle_upper(upper, overlay.placeholders)

    def cover_watch(self) -> CoverWatch:
        """The executor's inotify watch, read on the running loop (made on first use; a
        later loop of the executor's takes the reading over)."""
        if self._watch is None:
            watch = CoverWatch()
            try:
                loop = follow_loop(None, watch.fd, watch.read_events)
            except BaseException:
                watch.close()
                raise
            self._watch, self._watch_loop = watch, loop
        else:
            self._watch_loop = follow_loop(
                self._watch_loop, self._watch.fd, self._watch.read_events
            )
        return self._watch

    def spawn_helper(self) -> SpawnHelper | None:
        """The executor's spawn helper when the config asks for one, started on first use on
        the loop thread (its PDEATHSIG follows that thread); None when it is off or could not
        start (`helper_failure` says why: spawns then fork the executor, as without it)."""
        if not self._config.spawn_helper or self.helper_failure is not None:
            return None
        if self._helper is not None and self._helper.closed:
            self._helper = None  # it died: its commands were reported killed; a fresh one
        if self._helper is None:
            try:
                self._helper = SpawnHelper(self.helper_python)
            except SpawnHelperError as exc:
                self.helper_failure = str(exc)
                return None
        return self._helper

    # The interpreter the helper runs on (None: this one); a test points it elsewhere.
    helper_python: str | None = None

    def egress_grant(
        self, policy: SandboxPolicy, backend: SandboxBackend, domain: NamespaceFds | None
    ) -> ProxyGrant | None:
        """Under `isolated` with an allowlist: this command's grant on the executor's proxy,
        which listens at one address inside each trust domain's network namespace
        (``domain``: this command's) and is its only way out."""
        if policy.network is not NetworkMode.ISOLATED or not policy.allow_domains:
            return None
        ns = self.namespaces.ready
        if ns is None or domain is None or not backend.mounts:
            raise SandboxUnavailableError(
                policy.mode, "an allowlist needs the executor's network namespace (none here)"
            )
        if self._proxy is None:
            from bash_sandbox.egress import EgressProxyError
            from bash_sandbox.egress.factory import executor_proxy

            listener = socket.socket(fileno=os.dup(ns.listener))
            try:
                proxy = executor_proxy(listener, self._config, ns.tmp, self._egress_resolver)
            except ValueError as exc:  # CredentialError: a secret that cannot be read
                listener.close()
                raise SandboxUnavailableError(policy.mode, str(exc)) from exc
            try:
                proxy.start()
            except EgressProxyError as exc:
                proxy.close()  # never kept: the next call tries a fresh one
                raise SandboxUnavailableError(policy.mode, str(exc)) from exc
            self._proxy, self._proxy_nets = proxy, set()
        if domain.net not in self._proxy_nets:
            # Served in this domain from now on (the proxy owns the copy it is given).
            from bash_sandbox.egress import EgressProxyError

            try:
                self._proxy.add_listener(socket.socket(fileno=os.dup(domain.listener)))
            except EgressProxyError as exc:
                raise SandboxUnavailableError(policy.mode, str(exc)) from exc
            self._proxy_nets.add(domain.net)
        return self._proxy.register(policy.allow_domains)

    @property
    def proxy(self) -> EgressProxy | None:
        return self._proxy

    def drop_proxy(self) -> None:
        """Forget (and close) the proxy: the next allowlisted spawn starts a fresh one."""
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.close()

    # -- lifetime --------------------------------------------------------------------------

    async def aclose(self) -> None:
        """`close()`, with the loop-bound parts undone on the loop and the proxy's thread
        joined off it."""
        self.publications.close_all()
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # idle by now: the executor awaited every settle
        if self._watch is not None and self._watch_loop is asyncio.get_running_loop():
            with contextlib.suppress(RuntimeError, ValueError):
                self._watch_loop.remove_reader(self._watch.fd)
        if self._proxy is not None:
            await asyncio.to_thread(self._proxy.close)
        self.close()

    def close(self) -> None:
        """Give back everything, once (also from the executor's finalizer, on any thread)."""
        if self._closed:
            return
        self._closed = True
        self.publications.close_all()
        # Before the state goes: a released placeholder directory moves into its stash.
        with contextlib.suppress(OSError):
            self.survey.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self._watch is not None:
            self._watch.close()  # its reader was removed by aclose() where a loop still runs
        self.git_tree.close()
        if self._proxy is not None:
            # Its thread holds the listener, which holds the network namespace. Called on that
            # very thread (a collection there), close() stops the loop but cannot join it.
            with contextlib.suppress(RuntimeError):
                self._proxy.close()
        if self._helper is not None:
            self._helper.close()  # end of file: it kills and reaps what is left, and exits
        if self._supervisor is not None:
            self._supervisor.close()
        self.limits.close()
        self.mount_table.close()
        self.cache_holds.close()
        self.namespaces.close()
        self.state.remove()
