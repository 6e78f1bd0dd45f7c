"""`bash-sandbox doctor`: what this host can enforce, found by trying, not by guessing.

It asks the same `BackendSelector` the executor uses, built from the same config (an operator
runner included), which backend it would choose; it probes every backend with its own
functional probe, and each usable backend reports its own layers (files, processes,
network, unix sockets) for the requested network mode. Collecting (`collect_report`) does
the probing; everything else here is pure and renders plain data.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from bash_sandbox.backends.base import BackendProbe, LayerReport, SandboxBackend
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.linux.limit_enforcement import LimitEnforcement
from policies import NetworkMode, SandboxMode

LAYERS = ("files", "processes", "network", "unix sockets")
LIVE_PROBES_NOTE = (
    "every backend was probed for real just now; `run` may reuse a probe's verdict 'usable' from "
    "this user's probe cache (keyed on the binary, kernel, credentials and sysctls, at most "
    "a day old)"
)

Enforcement = Literal["full", "partial", "none"]


class Check(BaseModel):
    """One host capability, found by trying it."""

    model_config = ConfigDict(frozen=True)

    available: bool
    detail: str


class HostFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    platform: str
    kernel: str
    landlock_abi: int
    namespaces: Check
    # The package's compiled parts this install has (`linux/native/`): speed only; without
    # them the Python paths serve, with the same confinement.
    compiled: tuple[str, ...] = ()
    # Where executors keep their state (their git overlays' upper layers among it), and what
    # that filesystem is: one that cannot hold an upper fails workspace-write in a repository.
    state: str | None = None
    state_detail: str = ""


class LayerStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    layer: str
    enforcement: Enforcement
    how: str


class BackendStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    usable: bool
    detail: str
    binary: str | None
    version: str | None
    # "full" when every layer is; None when the backend is unusable.
    enforcement: Literal["full", "partial"] | None
    layers: tuple[LayerStatus, ...]


class DoctorReport(BaseModel):
    """Everything `doctor` prints; `--json` is exactly this model."""

    model_config = ConfigDict(frozen=True)

    version: str
    network: NetworkMode  # the network mode the layers are reported for
    host: HostFacts
    backends: tuple[BackendStatus, ...]
    # What the executor would use with this config (None: it would refuse to run).
    chosen_backend: str | None
    refusal: str | None = None  # why, when it would refuse
    degraded: str | None = None  # a loud note when the choice is weaker than a full backend
    notes: tuple[str, ...] = ()  # config trust and other facts the user should know
    # Each per-command limit of the config as this host enforces it (the chosen backend's).
    limits: tuple[LimitEnforcement, ...] = ()
    # The destinations the egress proxy serves under `isolated` (empty: loopback only).
    allow_domains: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.chosen_backend is not None


def backend_status(probe: BackendProbe, layers: Sequence[LayerReport]) -> BackendStatus:
    """One backend's row from its probe and its own layer reports."""
    if not probe.usable:
        unusable = tuple(
            LayerStatus(layer=name, enforcement="none", how=f"backend unusable: {probe.detail}")
            for name in LAYERS
        )
        return BackendStatus(
            name=probe.backend,
            usable=False,
            detail=probe.detail,
            binary=probe.binary,
            version=probe.version,
            enforcement=None,
            layers=unusable,
        )
    reports = {r.layer: r for r in layers}
    statuses = tuple(
        LayerStatus(layer=name, enforcement=reports[name].enforcement, how=reports[name].how)
        if name in reports
        else LayerStatus(layer=name, enforcement="none", how="not reported by the backend")
        for name in LAYERS
    )
    complete = all(s.enforcement == "full" for s in statuses)
    return BackendStatus(
        name=probe.backend,
        usable=True,
        detail=probe.detail,
        binary=probe.binary,
        version=probe.version,
        enforcement="full" if complete else "partial",
        layers=statuses,
    )


def _probe(backend: SandboxBackend, timeout_ms: int) -> BackendProbe:
    try:
        return backend.probe(timeout_ms)
    except Exception as exc:  # a probe that crashes is an unusable backend, never fatal
        return BackendProbe(backend.name, False, f"probe crashed: {type(exc).__name__}: {exc}")


def collect_report(
    config: SandboxBashConfig,
    *,
    network: NetworkMode,
    version: str,
    notes: tuple[str, ...] = (),
) -> DoctorReport:
    """Probe like the executor would, and every other backend for comparison."""
    from bash_sandbox.backends.landlock import landlock_abi
    from bash_sandbox.selection import BackendSelector, candidate_backends, namespaces_possible

    candidates = candidate_backends(
        config.backend,
        runner_command=tuple(config.runner_command),
        runner_failure_signatures=tuple(config.runner_failure_signatures),
    )
    # The audit tool never trusts the run path's probe cache: every probe below is live.
    selector = BackendSelector(candidates, config.probe_timeout_ms, cache=None)
    refusal: str | None = None
    chosen: str | None = None
    try:
        chosen = selector.choose(SandboxMode.WORKSPACE_WRITE).name
    except SandboxUnavailableError as exc:
        refusal = exc.detail
    probed = {p.backend: p for p in selector.probes()}
    # The configured candidates first, then every other backend for comparison.
    everyone: list[SandboxBackend] = list(candidates.full)
    for backend in (
        *candidate_backends("auto", platform="linux").full,
        *candidate_backends("seatbelt").full,
    ):
        if backend.name not in {b.name for b in everyone}:
            everyone.append(backend)
    statuses = []
    for backend in everyone:
        probe = probed.get(backend.name)
        if probe is None or (not probe.usable and "refused" in probe.detail):
            probe = _probe(backend, config.probe_timeout_ms)
        statuses.append(backend_status(probe, backend.layers(network) if probe.usable else ()))
    if selector.chosen is not None and selector.chosen not in everyone:
        fallback = selector.chosen
        statuses = [s for s in statuses if s.name != fallback.name]
        statuses.append(backend_status(probed[fallback.name], fallback.layers(network)))
    possible, why = (
        namespaces_possible() if sys.platform.startswith("linux") else (False, "not Linux")
    )
    host = HostFacts(
        platform=sys.platform,
        kernel=os.uname().release,
        landlock_abi=landlock_abi(),
        namespaces=Check(available=possible, detail=why),
        compiled=_compiled_parts(),
        **_state_place(),
    )
    limits: tuple[LimitEnforcement, ...] = ()
    if sys.platform.startswith("linux"):
        from bash_sandbox.linux.limit_enforcement import describe_enforcement

        # Landlock has no user namespace per command; bwrap makes one (RLIMIT_NPROC's scope).
        limits = describe_enforcement(config.limits, own_user_namespace=chosen != "landlock")
    return DoctorReport(
        version=version,
        network=network,
        host=host,
        backends=tuple(statuses),
        chosen_backend=chosen,
        refusal=refusal,
        degraded=selector.degraded,
        notes=(*notes, LIVE_PROBES_NOTE),
        limits=limits,
        allow_domains=tuple(config.allow_domains),
    )


_NO_BUILD = "the Python paths serve: slower, as confined"


def _state_place() -> dict[str, str | None]:
    """Where an executor of this uid puts its state (`state.state_parent`), and whether that
    filesystem can hold a git overlay's upper layer, with its free space."""
    if not sys.platform.startswith("linux"):
        return {}
    from bash_sandbox.errors import SandboxUnavailableError
    from bash_sandbox.linux.dir_watch import FILESYSTEM_MAGIC, filesystem_type
    from bash_sandbox.state import UPPER_FILESYSTEMS, state_parent

    try:
        place = state_parent(())
    except SandboxUnavailableError as exc:
        return {"state": None, "state_detail": exc.detail}
    kind = filesystem_type(place)
    names = {magic: name for name, magic in FILESYSTEM_MAGIC.items()}
    name = names.get(kind or 0, f"filesystem {kind:#x}" if kind else "unknown")
    st = os.statvfs(place)
    free = f"{st.f_bavail * st.f_frsize / (1 << 20):.0f} MiB free"
    if kind not in UPPER_FILESYSTEMS:
        return {
            "state": place,
            "state_detail": f"{name}, {free}: cannot hold git overlays, "
            "so workspace-write fails in a repository; point TMPDIR at another disk",
        }
    detail = f"{name}, {free}"
    if place.startswith("/dev/shm/"):
        detail += (
            ": every other place is on overlayfs (a container's disk); a command's "
            "new git objects must fit here (mount a volume for TMPDIR to lift it)"
        )
    return {"state": place, "state_detail": detail}


def _compiled_parts() -> tuple[str, ...]:
    if not sys.platform.startswith("linux"):
        return ()
    from bash_sandbox.linux import compiled_child, fast_writes, sandbox_init

    parts = {
        "write-watch fast path": fast_writes.library() is not None,
        "spawn helper child": compiled_child.built() is not None,
        "landlock init": sandbox_init.built() is not None,
    }
    return tuple(name for name, built in parts.items() if built)


def _table(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append((indent + "  ".join([*cells, row[-1]])).rstrip())
    return lines


def render_text(report: DoctorReport) -> str:
    """The human-readable report: host facts, a backend table, then each backend's layers."""
    host = report.host
    ns = host.namespaces
    chosen = report.chosen_backend or f"none: the executor refuses to run ({report.refusal})"
    lines = [
        f"bash-sandbox {report.version} doctor: {host.platform}, kernel {host.kernel}",
        "",
        *_table(
            [
                ("Landlock ABI:", str(host.landlock_abi) if host.landlock_abi else "none"),
                ("namespaces:", f"{'yes' if ns.available else 'no'} ({ns.detail})"),
                ("compiled parts:", ", ".join(host.compiled) or f"none ({_NO_BUILD})"),
                ("executor state:", f"{host.state or 'nowhere'} ({host.state_detail})"),
                ("chosen backend:", chosen),
                ("layers shown for:", f"network = {report.network.value}"),
            ]
        ),
    ]
    if report.degraded:
        lines += ["", f"WARNING: {report.degraded}"]
    lines += [f"note: {note}" for note in report.notes]
    lines.append("")
    rows: list[tuple[str, ...]] = [("BACKEND", "USABLE", "ENFORCES", "BINARY", "VERSION", "DETAIL")]
    for b in report.backends:
        rows.append(
            (
                b.name,
                "yes" if b.usable else "no",
                b.enforcement or "-",
                b.binary or "-",
                b.version or "-",
                b.detail,
            )
        )
    lines += _table(rows)
    for b in report.backends:
        if not b.usable:
            continue
        lines += ["", f"{b.name} layers:"]
        lines += _table(
            [(layer.layer, layer.enforcement, layer.how) for layer in b.layers], indent="  "
        )
    egress = ", ".join(report.allow_domains) or "none (isolated commands reach loopback only)"
    lines += ["", f"egress allowlist: {egress}"]
    if report.limits:
        lines += ["", f"limits per command ({report.chosen_backend or 'no backend'}):"]
        rows = [("LIMIT", "VALUE", "ENFORCED BY", "DETAIL")]
        for limit in report.limits:
            value = "-" if limit.value is None else _limit_value(limit.limit, limit.value)
            rows.append((limit.limit, value, limit.mechanism.value, limit.detail))
        lines += _table(rows, indent="  ")
    return "\n".join(lines) + "\n"


def _limit_value(name: str, value: float) -> str:
    if name in ("memory", "tmp-space", "shm-space"):
        mib = value / (1 << 20)
        return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"
    if name == "cpu":
        return f"{value:g} cores"
    if name == "cpu-time":
        return f"{value:g} s"
    return f"{value:g}"
