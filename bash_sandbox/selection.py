"""Choosing a backend: explicit names are used or fail closed; `auto` probes in order.

Probes are functional (each backend confines a tiny command) and run once per executor,
bounded by `probe_timeout_ms`; their results are kept for the executor's lifetime, failures
included. Across processes, a full backend's "usable" may be taken from this uid's probe
cache (`probe_cache`: keyed on what the probe depends on, and unable to make a spawn
weaker); `doctor` builds its selector without it and always probes for real.

Never silently weaker: Landlock alone (no namespaces, always `partial`) is chosen only when
this host cannot make the namespaces the full backends need; where it can, a full backend
that fails its probe makes the executor fail closed instead. A degraded choice is loud: it
is in every result's `warnings`, in the CLI's output and in `doctor`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from dataclasses import dataclass

from bash_sandbox.backends.base import BackendProbe, SandboxBackend
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.probe_cache import USER_PROBE_CACHE, ProbeCache
from policies import NetworkMode, SandboxMode

DEGRADED_WARNING = (
    "bash-sandbox: no namespaces on this host: Landlock alone confines commands (partial: "
    "no protected names, private /tmp, PID namespace or UDP isolation); see `bash-sandbox doctor`"
)


@dataclass(frozen=True)
class Candidates:
    """The backends to probe in order, and the namespace-less fallback (if any)."""

    full: tuple[SandboxBackend, ...]
    fallback: SandboxBackend | None = None


def candidate_backends(
    backend: str,
    *,
    runner_command: tuple[str, ...] = (),
    runner_failure_signatures: tuple[str, ...] = (),
    platform: str = sys.platform,
) -> Candidates:
    """Backends to try, in order, for a configured ``backend`` name on ``platform``.

    Each backend's module is imported only when it is a candidate (Seatbelt's never on
    Linux, Landlock's bindings not for `--backend bwrap`)."""
    if runner_command:
        from bash_sandbox.backends.bwrap import BwrapBackend

        # An operator-asserted runner replaces bwrap; it is never silently skipped.
        runner = BwrapBackend(
            runner_prefix=runner_command, failure_signatures=runner_failure_signatures
        )
        return Candidates((runner,))
    if backend == "bwrap":
        from bash_sandbox.backends.bwrap import BwrapBackend

        return Candidates((BwrapBackend(),))
    if backend == "landlock":
        from bash_sandbox.backends.landlock import LandlockBackend
        from bash_sandbox.backends.landlock_only import LandlockOnlyBackend

        return Candidates((LandlockBackend(),), LandlockOnlyBackend())
    # macOS has no private loopback: allowing it (the "loopback still works") also
    # reaches the host's own local services, so Seatbelt reports that network layer partial.
    if backend == "seatbelt" or (backend == "auto" and platform == "darwin"):
        from bash_sandbox.backends.seatbelt import SeatbeltBackend

        return Candidates((SeatbeltBackend(allow_loopback=True),))
    if platform.startswith("linux"):
        from bash_sandbox.backends.bwrap import BwrapBackend
        from bash_sandbox.backends.landlock import LandlockBackend
        from bash_sandbox.backends.landlock_only import LandlockOnlyBackend

        return Candidates((BwrapBackend(), LandlockBackend()), LandlockOnlyBackend())
    return Candidates(())


def namespaces_possible() -> tuple[bool, str]:
    """Whether this process can make the namespaces the full Linux backends need."""
    from bash_sandbox.linux.namespaces import NamespaceError, ScratchPaths, create_namespaces
    from bash_sandbox.state import remove_tree

    tmp = tempfile.mkdtemp(prefix="bash-sandbox-nscheck-")
    try:
        paths = ScratchPaths(*(f"{tmp}/{n}" for n in ("tmp", "shm", "pts")))
        for p in (paths.tmp, paths.shm, paths.pts):
            os.mkdir(p, 0o700)
        try:
            fds = create_namespaces(paths, tmp_bytes=1 << 16, shm_bytes=1 << 16)
        except NamespaceError as exc:
            return False, str(exc)
        for fd in (fds.mnt, fds.net, fds.tmp, fds.shm, fds.pts, fds.listener, fds.user):
            if fd is not None:
                os.close(fd)
        return True, "user, mount and network namespaces can be made"
    finally:
        remove_tree(tmp)


class BackendSelector:
    """Probes candidates once and hands out the first usable backend (or fails closed).

    ``cache`` (default: this uid's) may vouch for a full candidate instead of its probe;
    None probes every candidate for real."""

    def __init__(
        self,
        candidates: Candidates,
        probe_timeout_ms: int,
        *,
        cache: ProbeCache | None = USER_PROBE_CACHE,
    ) -> None:
        self._candidates = candidates
        self._timeout = probe_timeout_ms
        self._cache = cache
        self._lock = threading.Lock()
        self._probes: list[BackendProbe] | None = None
        self._chosen: SandboxBackend | None = None
        self._vouched: SandboxBackend | None = None
        self.degraded: str | None = None

    @property
    def candidates(self) -> Candidates:
        return self._candidates

    def probes(self) -> list[BackendProbe]:
        self._ensure()
        assert self._probes is not None
        return list(self._probes)

    def _probe(self, backend: SandboxBackend) -> BackendProbe:
        try:
            return backend.probe(self._timeout)
        except Exception as exc:  # a probe that crashes is an unusable backend
            return BackendProbe(backend.name, False, f"probe crashed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _vouched_probe(backend: SandboxBackend) -> BackendProbe:
        path = getattr(backend, "path", None)
        return BackendProbe(
            backend.name,
            True,
            "confined a probe command here earlier (cached verdict; `bash-sandbox doctor` "
            "probes for real)",
            binary=path if isinstance(path, str) else None,
            layers=backend.layers(NetworkMode.ISOLATED),
        )

    def distrust_cached(self) -> None:
        """Forget the cached verdict this selector used (its spawn failed): the next
        executor of this uid probes the backend for real."""
        if self._cache is not None and self._vouched is not None:
            self._cache.forget(self._vouched)

    def _ensure(self) -> None:
        with self._lock:
            if self._probes is not None:
                return
            probes: list[BackendProbe] = []
            # In order, one candidate at a time: a cached verdict only ever stands in for the
            # probe of the candidate a live probe would try next.
            for backend in self._candidates.full:
                if self._cache is not None and self._cache.vouches_for(backend):
                    probe = self._vouched_probe(backend)
                    self._vouched = backend
                else:
                    probe = self._probe(backend)
                    if self._cache is not None:
                        self._cache.record(backend, probe.usable)
                probes.append(probe)
                if probe.usable:
                    self._chosen = backend
                    break
            fallback = self._candidates.fallback
            if self._chosen is None and fallback is not None:
                possible, why = namespaces_possible()
                if possible:
                    probes.append(
                        BackendProbe(
                            "landlock",
                            False,
                            "Landlock alone refused: this host can make namespaces, so a full "
                            "backend must work here (fail closed rather than run weaker)",
                        )
                    )
                else:
                    probe = self._probe(fallback)
                    probes.append(probe)
                    if probe.usable:
                        self._chosen = fallback
                        self.degraded = f"{DEGRADED_WARNING} ({why})"
            self._probes = probes

    def choose(self, mode: SandboxMode) -> SandboxBackend:
        """The backend confining this executor's commands, or `SandboxUnavailableError`."""
        self._ensure()
        if self._chosen is None:
            assert self._probes is not None
            why = "; ".join(f"{p.backend}: {p.detail}" for p in self._probes)
            raise SandboxUnavailableError(mode, why or "no sandbox backend for this platform")
        return self._chosen

    @property
    def chosen(self) -> SandboxBackend | None:
        return self._chosen
