"""The line a harness shows for a denial: what was refused, why, and the next step.

Shapes (``(inferred)`` follows the mode when the evidence is the command's own output)::

    [sandbox: write to /srv/out denied (outside the writable roots) under workspace-write
     mode; add it to writable_roots or ask for danger-full-access]
    [sandbox: read of ~/.ssh/id_rsa denied (deny_read) under read-only mode; ...]
    [sandbox: connect to unix socket /run/docker.sock denied (host unix socket) under
     read-only mode; add it to allow_unix_sockets]
    [sandbox: connect to 93.184.216.34:443 denied under isolated network; ask for
     network=host or add the domain to allow_domains]

The generic `policies.sandbox_denial_marker(mode)` stays as it was, for callers without
denials.
"""

from __future__ import annotations

import os

from bash_sandbox.facts.inference import REASON_DENY_READ, REASON_OUTSIDE_ROOTS, REASON_READ_ONLY
from bash_seam import DenialEvidence, DenialKind, SandboxDenial, SandboxFacts
from policies import NetworkMode, SandboxMode
from policies.autorun import UNPROTECT_KEY
from policies.egress import egress_step


def _shown(path: str) -> str:
    # The home as "~": shorter, and the same on every machine in a transcript.
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    return path


def _file_step(denial: SandboxDenial) -> str:
    if denial.reason == REASON_READ_ONLY:
        return "ask for workspace-write"
    if denial.reason == REASON_OUTSIDE_ROOTS:
        return "add it to writable_roots or ask for danger-full-access"
    if denial.reason == REASON_DENY_READ:
        return "remove it from deny_read or ask for danger-full-access"
    if denial.reason.startswith("protected name"):
        if UNPROTECT_KEY in denial.reason:
            name = denial.reason.split()[2].rstrip(":,")
            return f"add {name} to {UNPROTECT_KEY} if commands may change it, after review"
        return "protected names stay read-only; ask for danger-full-access if the change is meant"
    return "ask for a wider mode"


def _socket_words(denial: SandboxDenial) -> tuple[str, str]:
    operation = denial.operation or "connect"
    if denial.target.startswith(("/", "@")):
        return f"{operation} to unix socket {_shown(denial.target)}", "add it to allow_unix_sockets"
    # A socket family (AF_VSOCK, AF_PACKET, ...): no policy key opens it.
    return (
        f"{operation} {denial.target}",
        "confined commands never get this socket family; ask for danger-full-access",
    )


def _network_step(denial: SandboxDenial) -> str:
    if denial.evidence is DenialEvidence.PROXY:
        step = egress_step(denial.reason)
        if "allow_domains" in step:
            return "add the domain to allow_domains or ask for network=host"
        return step
    return "ask for network=host or add the domain to allow_domains"


def denial_marker(
    denial: SandboxDenial, mode: SandboxMode | str, network: NetworkMode | str | None
) -> str:
    """One marker line for ``denial`` under ``mode`` and ``network`` (see the module doc)."""
    mode = SandboxMode(mode)
    inferred = " (inferred)" if denial.evidence is DenialEvidence.INFERRED else ""
    # "(read-only mode) under read-only mode" says nothing twice.
    redundant = denial.reason in ("", f"{mode.value} mode", "isolated network")
    reason = "" if redundant else f" ({denial.reason})"
    if denial.kind in (DenialKind.NETWORK_CONNECT, DenialKind.NETWORK_RESOLVE):
        net = NetworkMode(network).value if network is not None else NetworkMode.ISOLATED.value
        verb = "connect to" if denial.kind is DenialKind.NETWORK_CONNECT else "resolve"
        return (
            f"[sandbox: {verb} {denial.target} denied{reason} under {net} network{inferred}; "
            f"{_network_step(denial)}]"
        )
    if denial.kind is DenialKind.SOCKET:
        what, step = _socket_words(denial)
    elif denial.kind is DenialKind.FILE_READ:
        what, step = f"read of {_shown(denial.target)}", _file_step(denial)
    else:
        what, step = f"write to {_shown(denial.target)}", _file_step(denial)
    return f"[sandbox: {what} denied{reason} under {mode.value} mode{inferred}; {step}]"


def result_markers(facts: SandboxFacts | None) -> list[str]:
    """One marker per recorded denial (a run that succeeded can carry some too: a write git
    reported done but the control plane discarded), then a count of the ones left out."""
    if facts is None:
        return []
    network = facts.network or NetworkMode.HOST
    lines = [denial_marker(d, facts.mode, network) for d in facts.denials]
    extra = facts.denials_total - len(facts.denials)
    if extra > 0:
        lines.append(f"[sandbox: {extra} more denial(s) not shown]")
    return list(dict.fromkeys(lines))
