"""Choosing a backend: explicit names are used or fail closed; `auto` probes in order.

Probes are functional (each backend confines a tiny command) and run once per executor,
bounded by `probe_timeout_ms`; their results are cached, failures included.
"""

from __future__ import annotations

import sys
import threading

from bash_sandbox.backends.base import BackendProbe, SandboxBackend
from bash_sandbox.errors import SandboxUnavailableError
from policies import SandboxMode


def candidate_backends(
    backend: str,
    *,
    runner_command: tuple[str, ...] = (),
    runner_failure_signatures: tuple[str, ...] = (),
    platform: str = sys.platform,
) -> list[SandboxBackend]:
    """Backends to try, in order, for a configured ``backend`` name on ``platform``."""
    from bash_sandbox.backends.bwrap import BwrapBackend
    from bash_sandbox.backends.landlock import LandlockBackend
    from bash_sandbox.backends.landlock_only import LandlockOnlyBackend
    from bash_sandbox.backends.seatbelt import SeatbeltBackend

    if runner_command:
        # An operator-asserted runner replaces bwrap; it is never silently skipped.
        return [
            BwrapBackend(runner_prefix=runner_command, failure_signatures=runner_failure_signatures)
        ]
    if backend == "bwrap":
        return [BwrapBackend()]
    if backend == "landlock":
        # Without namespaces, Landlock alone still confines, and every result says partial.
        return [LandlockBackend(), LandlockOnlyBackend()]
    # macOS has no private loopback: allowing it (the "loopback still works") also
    # reaches the host's own local services, so Seatbelt reports that network layer partial.
    if backend == "seatbelt" or (backend == "auto" and platform == "darwin"):
        return [SeatbeltBackend(allow_loopback=True)]
    if platform.startswith("linux"):
        return [BwrapBackend(), LandlockBackend(), LandlockOnlyBackend()]
    return []


class BackendSelector:
    """Probes candidates once and hands out the first usable backend."""

    def __init__(self, candidates: list[SandboxBackend], probe_timeout_ms: int) -> None:
        self._candidates = candidates
        self._timeout = probe_timeout_ms
        self._lock = threading.Lock()
        self._probes: list[BackendProbe] | None = None
        self._chosen: SandboxBackend | None = None

    def probes(self) -> list[BackendProbe]:
        self._ensure()
        assert self._probes is not None
        return list(self._probes)

    def _ensure(self) -> None:
        with self._lock:
            if self._probes is not None:
                return
            probes: list[BackendProbe] = []
            for backend in self._candidates:
                try:
                    probe = backend.probe(self._timeout)
                except Exception as exc:  # a probe that crashes is an unusable backend
                    probe = BackendProbe(backend.name, False, f"probe crashed: {exc}")
                probes.append(probe)
                if probe.usable:
                    self._chosen = backend
                    break
            self._probes = probes

    def choose(self, mode: SandboxMode) -> SandboxBackend:
        """The backend confining this executor's commands, or `SandboxUnavailableError`."""
        self._ensure()
        if self._chosen is None:
            assert self._probes is not None
            why = "; ".join(f"{p.backend}: {p.detail}" for p in self._probes)
            raise SandboxUnavailableError(mode, why or "no sandbox backend for this platform")
        return self._chosen
