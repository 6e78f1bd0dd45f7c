"""`bash-sandbox doctor`: what this host can enforce, found by trying, not by guessing.

It probes every backend (bwrap, Landlock, Seatbelt) with its own functional probe, checks
the host facts the backends rely on (Landlock ABI, user and network namespaces) by actually
using them, and says for each backend how each layer (files, processes, network, unix
sockets) is enforced: `full`, `partial` or `none`, and how. Collecting (`collect_report`)
does the probing; everything else here is pure and renders or merges plain data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from bash_sandbox.backends.base import BackendProbe, LayerReport, SandboxBackend
from policies import NetworkMode

LAYERS = ("files", "processes", "network", "unix sockets")
BACKENDS = ("bwrap", "landlock", "seatbelt")
# The order `backend = "auto"` tries them in (selection.candidate_backends).
AUTO_ORDER = {"darwin": ("seatbelt",), "linux": ("bwrap", "landlock")}

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
    user_namespaces: Check
    network_namespace: Check


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
    auto_backend: str | None  # what `backend = "auto"` picks here

    @property
    def usable(self) -> bool:
        return any(b.usable for b in self.backends)


# -- host checks (these touch the system) ----------------------------------------------------


def check_user_namespaces(timeout_s: float = 5.0) -> Check:
    """Enabled by sysctl *and* creatable right now (`unshare -U true`)."""
    path = "/proc/sys/user/max_user_namespaces"
    try:
        with open(path) as fh:
            limit = int(fh.read().strip())
    except (OSError, ValueError) as exc:
        return Check(available=False, detail=f"cannot read {path}: {exc}")
    if limit <= 0:
        return Check(available=False, detail=f"disabled: max_user_namespaces={limit}")
    unshare = shutil.which("unshare")
    if unshare is None:
        return Check(
            available=False,
            detail=f"max_user_namespaces={limit}, but `unshare` (util-linux) is missing",
        )
    try:
        done = subprocess.run(
            [unshare, "-U", "true"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Check(available=False, detail=f"`unshare -U true` could not run: {exc}")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return Check(available=False, detail=f"`unshare -U true` failed: {why}")
    return Check(available=True, detail=f"max_user_namespaces={limit}; `unshare -U true` succeeded")


def check_network_namespace() -> Check:
    """Make the executor's loopback-only namespace exactly as it would, then drop it."""
    try:
        from bash_sandbox.linux.netns import NetworkNamespace

        netns = NetworkNamespace()
        fds = netns.fds()
    except Exception as exc:  # ImportError (no pyroute2) included: all mean "not here"
        return Check(available=False, detail=str(exc))
    owner = "the initial" if fds.user is None else "a private"
    netns.close()
    return Check(
        available=True,
        detail=f"created a loopback-only network namespace owned by {owner} user namespace",
    )


def _tool_version(path: str) -> str | None:
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0] if lines else None


def _safe_probe(name: str, make: Callable[[], SandboxBackend], timeout_ms: int) -> BackendProbe:
    # A backend that cannot even be imported or constructed is reported, never fatal: the
    # Seatbelt module, for one, may be missing on a partial install.
    try:
        return make().probe(timeout_ms)
    except ImportError as exc:
        return BackendProbe(name, False, f"backend module not importable: {exc}")
    except Exception as exc:
        return BackendProbe(name, False, f"probe crashed: {type(exc).__name__}: {exc}")


def _bwrap() -> SandboxBackend:
    from bash_sandbox.backends.bwrap import BwrapBackend

    return BwrapBackend()


def _landlock() -> SandboxBackend:
    from bash_sandbox.backends.landlock import LandlockBackend

    return LandlockBackend()


def _landlock_only() -> SandboxBackend:
    from bash_sandbox.backends.landlock_only import LandlockOnlyBackend

    return LandlockOnlyBackend()


def _seatbelt() -> SandboxBackend:
    from bash_sandbox.backends.seatbelt import SeatbeltBackend

    return SeatbeltBackend()


def _seatbelt_layers(network: NetworkMode) -> tuple[LayerReport, ...]:
    try:
        from bash_sandbox.backends.seatbelt import SeatbeltBackend

        return SeatbeltBackend().layers(network)
    except Exception:
        return ()


def collect_report(*, network: NetworkMode, probe_timeout_ms: int, version: str) -> DoctorReport:
    """Probe every backend and the host; the layers are reported for ``network``."""
    from bash_sandbox.backends.landlock import landlock_abi

    host = HostFacts(
        platform=sys.platform,
        kernel=os.uname().release,
        landlock_abi=landlock_abi(),
        user_namespaces=check_user_namespaces(),
        network_namespace=check_network_namespace(),
    )
    probes = [
        _safe_probe("bwrap", _bwrap, probe_timeout_ms),
        _safe_probe("landlock", _landlock, probe_timeout_ms),
        _safe_probe("seatbelt", _seatbelt, probe_timeout_ms),
    ]
    if not probes[1].usable:
        # The executor falls back to Landlock alone (reported partial): show that instead.
        fallback = _safe_probe("landlock", _landlock_only, probe_timeout_ms)
        if fallback.usable:
            probes[1] = fallback
    if probes[1].binary is None and probes[1].usable:
        # Landlock runs each command under util-linux `unshare --fork --kill-child`.
        unshare = shutil.which("unshare")
        if unshare is not None:
            probes[1] = _with_binary(probes[1], unshare, _tool_version(unshare))
    seatbelt_layers = _seatbelt_layers(network) if probes[2].usable else ()
    return build_report(
        probes, host, network=network, version=version, seatbelt_layers=seatbelt_layers
    )


def _with_binary(probe: BackendProbe, binary: str, tool_version: str | None) -> BackendProbe:
    version = probe.version
    if tool_version:
        version = f"{version}; {tool_version}" if version else tool_version
    return BackendProbe(
        probe.backend,
        probe.usable,
        probe.detail,
        binary=binary,
        version=version,
        layers=probe.layers,
        extra=probe.extra,
    )


# -- pure: from probes and host facts to the report ------------------------------------------


def _bwrap_layers(host: HostFacts, network: NetworkMode) -> dict[str, LayerReport]:
    if network is NetworkMode.HOST:
        return {
            "network": LayerReport(
                "network", "none", "host network requested: the command shares the host's network"
            ),
            "unix sockets": LayerReport(
                "unix sockets",
                "none",
                "host network: AF_UNIX is allowed and the host's abstract sockets are reachable",
            ),
        }
    if host.network_namespace.available:
        net = LayerReport(
            "network",
            "full",
            "the executor's loopback-only network namespace, "
            "shared by its commands, entered before bwrap starts",
        )
    else:
        net = LayerReport(
            "network",
            "full",
            "bwrap --unshare-net: a loopback-only namespace "
            "per command (the executor's shared one cannot be created here: "
            f"{host.network_namespace.detail})",
        )
    unix = LayerReport(
        "unix sockets",
        "full",
        "seccomp refuses AF_UNIX socket creation; abstract sockets are per network namespace",
    )
    return {"network": net, "unix sockets": unix}


def _landlock_layers(host: HostFacts, network: NetworkMode) -> dict[str, LayerReport]:
    scoped = host.landlock_abi >= 6
    if network is NetworkMode.HOST:
        return {
            "network": LayerReport(
                "network", "none", "host network requested: the command shares the host's network"
            ),
            "unix sockets": LayerReport(
                "unix sockets",
                "partial" if scoped else "none",
                "host network: AF_UNIX is allowed; Landlock scopes abstract sockets to the sandbox"
                if scoped
                else "host network: AF_UNIX is allowed and the host's "
                "abstract sockets are reachable (no Landlock scoping before ABI 6)",
            ),
        }
    if not host.network_namespace.available:
        # The executor refuses isolated Landlock runs rather than run them on the host network.
        net = LayerReport(
            "network",
            "none",
            "no network namespace here "
            f"({host.network_namespace.detail}): isolated commands are refused",
        )
    else:
        net = LayerReport(
            "network",
            "full",
            "the executor's loopback-only network namespace, entered before Landlock applies",
        )
    unix = LayerReport(
        "unix sockets",
        "full",
        "seccomp refuses AF_UNIX socket creation; "
        "abstract sockets are per network namespace"
        + (" and scoped by Landlock" if scoped else ""),
    )
    return {"network": net, "unix sockets": unix}


def _defaults_for(
    name: str, host: HostFacts, network: NetworkMode, seatbelt_layers: Sequence[LayerReport]
) -> dict[str, LayerReport]:
    if name == "bwrap":
        return _bwrap_layers(host, network)
    if name == "landlock":
        return _landlock_layers(host, network)
    return {r.layer: r for r in seatbelt_layers}


def backend_status(
    probe: BackendProbe,
    host: HostFacts,
    network: NetworkMode,
    seatbelt_layers: Sequence[LayerReport] = (),
) -> BackendStatus:
    """One backend's row: the probe's own layer reports win, host facts fill the rest."""
    if not probe.usable:
        layers = tuple(
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
            layers=layers,
        )
    reports = _defaults_for(probe.backend, host, network, seatbelt_layers)
    reports.update({r.layer: r for r in probe.layers})
    layers = tuple(_layer_status(reports.get(name), name) for name in LAYERS)
    complete = all(layer.enforcement == "full" for layer in layers)
    return BackendStatus(
        name=probe.backend,
        usable=True,
        detail=probe.detail,
        binary=probe.binary,
        version=probe.version,
        enforcement="full" if complete else "partial",
        layers=layers,
    )


def _layer_status(report: LayerReport | None, name: str) -> LayerStatus:
    if report is None:
        return LayerStatus(layer=name, enforcement="none", how="not reported by the backend")
    level: Enforcement = (
        "full"
        if report.enforcement == "full"
        else "partial"
        if report.enforcement == "partial"
        else "none"
    )
    return LayerStatus(layer=name, enforcement=level, how=report.how)


def build_report(
    probes: Sequence[BackendProbe],
    host: HostFacts,
    *,
    network: NetworkMode,
    version: str,
    seatbelt_layers: Sequence[LayerReport] = (),
) -> DoctorReport:
    """Assemble the report from probe results and host facts. Pure."""
    statuses = tuple(backend_status(p, host, network, seatbelt_layers) for p in probes)
    usable = {s.name for s in statuses if s.usable}
    platform = "linux" if host.platform.startswith("linux") else host.platform
    auto = next((n for n in AUTO_ORDER.get(platform, ()) if n in usable), None)
    return DoctorReport(
        version=version, network=network, host=host, backends=statuses, auto_backend=auto
    )


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

    def yes(check: Check) -> str:
        return f"{'yes' if check.available else 'no'} ({check.detail})"

    lines = [
        f"bash-sandbox {report.version} doctor: {host.platform}, kernel {host.kernel}",
        "",
        *_table(
            [
                ("Landlock ABI:", str(host.landlock_abi) if host.landlock_abi else "none"),
                ("user namespaces:", yes(host.user_namespaces)),
                ("network namespace:", yes(host.network_namespace)),
                ("auto backend:", report.auto_backend or "none usable"),
                ("layers shown for:", f"network = {report.network.value}"),
            ]
        ),
        "",
    ]
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
    return "\n".join(lines) + "\n"
