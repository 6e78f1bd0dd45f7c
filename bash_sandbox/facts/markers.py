"""The lines a harness shows for denials and hints: what was refused, why, the next step.

Shapes::

    [sandbox: write to /srv/out denied (outside the writable roots) under workspace-write
     mode; add it to writable_roots or ask for danger-full-access]
    [sandbox: read of ~/.ssh/id_rsa denied (deny_read) under read-only mode; ...]
    [sandbox: connect to unix socket /run/docker.sock denied (host unix socket) under
     read-only mode; add it to allow_unix_sockets]
    [sandbox: connect to 93.184.216.34:443 denied under isolated network; ask for
     network=host or add the domain to allow_domains]
    [sandbox: 14 writes in /ws/.git/modules/m/hooks denied (git control plane (hooks))
     under workspace-write mode: a, b, c and 11 more; git config, hooks and info stay ...]

A group of one is the single line. Hints say they are not denials, and start differently
so a harness matching ``[sandbox:`` never takes one for a denial::

    [sandbox hint: the output says a write to /etc/x failed (outside the writable roots
     under read-only mode); no refusal was seen; if it was refused: add it to ...]
    [sandbox hint: the host serves 127.0.0.1:5432; this sandbox has its own loopback;
     ask for network=host]

The generic `policies.sandbox_denial_marker(mode)` stays as it was, for callers without
denials.
"""

from __future__ import annotations

import os

from bash_sandbox.facts.flags import DENIALS_LIMIT
from bash_sandbox.facts.inference import REASON_DENY_READ, REASON_OUTSIDE_ROOTS, REASON_READ_ONLY
from bash_sandbox.own_code import REASON as OWN_CODE
from bash_seam import (
    DenialEvidence,
    DenialGroup,
    DenialKind,
    GitImportOutcome,
    HintSource,
    SandboxDenial,
    SandboxFacts,
    SandboxHint,
)
from policies import NetworkMode, SandboxMode
from policies.autorun import UNPROTECT_KEY
from policies.egress import egress_step


def _shown(path: str) -> str:
    # The home as "~": shorter, and the same on every machine in a transcript.
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    return path


def _file_step(denial: SandboxDenial | SandboxHint | DenialGroup) -> str:
    if denial.reason == REASON_READ_ONLY:
        return "ask for workspace-write"
    if denial.reason == REASON_OUTSIDE_ROOTS:
        if isinstance(denial, DenialGroup):
            where = denial.targets[0] if denial.targets else denial.place
        else:
            where = denial.target
        return _home_state_step(where) or ("add it to writable_roots or ask for danger-full-access")
    if denial.reason == REASON_DENY_READ:
        return "remove it from deny_read or ask for danger-full-access"
    # Git's config (its `config.lock` renamed over it: branch tracking, a rename's section,
    # remotes) is the host's in every mode but danger-full-access: say where to change it.
    if denial.reason in ("protected name .git", "protected name .git/config") or (
        denial.reason.startswith("git control plane") and "config" in denial.reason
    ):
        return (
            "git config stays the host's; run that git command on the host (`git submodule "
            "init`, `git remote add`, `git branch -u`, `git config`), then go on here"
        )
    if denial.reason.startswith("git control plane"):
        # The overlay discarded it: git's own files are the host's to change.
        return "git config, hooks and info stay the host's; change them outside the sandbox"
    if denial.reason.startswith(OWN_CODE):
        return "install bash-sandbox outside the project (pipx, uv tool) to keep it writable"
    if denial.reason.startswith(("git config: ", "hook chain: ")):
        # What host git reads or runs: a wider mode is not the way, the user's config is.
        return "host git runs or reads it; change it on the host, or name another file there"
    # The write watch's word for a protected name (or a placeholder) inside a root.
    if denial.reason.startswith(("protected name", "held read-only")):
        if UNPROTECT_KEY in denial.reason:
            name = denial.reason.split()[2].rstrip(":,")
            return f"add {name} to {UNPROTECT_KEY} if commands may change it, after review"
        return "protected names stay read-only; ask for danger-full-access if the change is meant"
    return "ask for a wider mode"


_BROWSER_PROFILES = ("chromium", "google-chrome", "chrome", "headless_shell")


def _home_state_step(target: str) -> str | None:
    """The step for a tool writing its own state in the home (a usability pass: Chromium's
    profile made agents ask for danger-full-access where a flag was all it took)."""
    home = os.path.expanduser("~")
    parts = target.removeprefix(home + "/").split("/") if target.startswith(home + "/") else []
    if len(parts) < 2 or parts[0] not in (".config", ".cache", ".local"):
        return None
    if any(p.startswith(_BROWSER_PROFILES) for p in parts[1:3]):
        return (
            "Chromium keeps its profile there: pass --user-data-dir=$(mktemp -d) (and "
            "--no-sandbox: its own sandbox needs what this one takes away)"
        )
    return (
        "a tool's own state in the home: point it elsewhere (XDG_CONFIG_HOME, "
        "XDG_CACHE_HOME, XDG_DATA_HOME or its own option, to /tmp or the workspace), or add "
        "it to writable_roots"
    )


def _socket_words(denial: SandboxDenial) -> tuple[str, str]:
    operation = denial.operation or "connect"
    if denial.target.startswith(("/", "@")):
        return f"{operation} to unix socket {_shown(denial.target)}", "add it to allow_unix_sockets"
    # A socket family (AF_VSOCK, AF_PACKET, ...): no policy key opens it.
    return (
        f"{operation} {denial.target}",
        "confined commands never get this socket family; ask for danger-full-access",
    )


def _network_step(denial: SandboxDenial | DenialGroup) -> str:
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
        if denial.kind is DenialKind.NETWORK_RESOLVE and denial.target.endswith(":53"):
            # The supervisor saw the connect to the resolver, not the name: say which it is.
            verb = "name lookup through the resolver"
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


_PLURAL = {
    DenialKind.FILE_WRITE: "writes",
    DenialKind.FILE_READ: "reads",
    DenialKind.SOCKET: "sockets",
    DenialKind.NETWORK_CONNECT: "connects",
    DenialKind.NETWORK_RESOLVE: "name lookups",
}


def group_marker(
    group: DenialGroup, mode: SandboxMode | str, network: NetworkMode | str | None
) -> str:
    """One line for a group: the single denial's line, or a count with the first targets."""
    if group.count == 1:
        only = SandboxDenial(
            kind=group.kind,
            target=group.targets[0],
            operation=group.operation,
            reason=group.reason,
            evidence=group.evidence,
        )
        return denial_marker(only, mode, network)
    mode = SandboxMode(mode)
    redundant = group.reason in ("", f"{mode.value} mode", "isolated network")
    reason = "" if redundant else f" ({group.reason})"
    files = group.kind in (DenialKind.FILE_WRITE, DenialKind.FILE_READ)
    names = [os.path.basename(t) if files else _shown(t) for t in group.targets]
    more = group.count - len(names)
    sample = ", ".join(names) + (f" and {more} more" if more > 0 else "")
    where = f" in {_shown(group.place)}" if group.place.startswith("/") else ""
    if group.kind is DenialKind.SOCKET and group.place and not where:
        where = f" of {group.place}"
    what = f"{group.count} {_PLURAL[group.kind]}{where} denied{reason}"
    if group.kind in (DenialKind.NETWORK_CONNECT, DenialKind.NETWORK_RESOLVE):
        net = NetworkMode(network).value if network is not None else NetworkMode.ISOLATED.value
        return f"[sandbox: {what} under {net} network: {sample}; {_network_step(group)}]"
    if group.kind is DenialKind.SOCKET:
        step = (
            "add them to allow_unix_sockets"
            if group.targets[0].startswith(("/", "@"))
            else "confined commands never get this socket family; ask for danger-full-access"
        )
    else:
        step = _file_step(group)
    return f"[sandbox: {what} under {mode.value} mode: {sample}; {step}]"


def hint_marker(
    hint: SandboxHint, mode: SandboxMode | str, network: NetworkMode | str | None
) -> str:
    """One line for a hint, saying what it rests on."""
    mode = SandboxMode(mode)
    if hint.source is HintSource.HOST_LISTENER:
        return (
            f"[sandbox hint: the host serves {hint.target}; this sandbox has its own loopback; "
            "ask for network=host]"
        )
    if hint.kind is DenialKind.NETWORK_RESOLVE:
        net = NetworkMode(network).value if network is not None else NetworkMode.ISOLATED.value
        return (
            f"[sandbox hint: the lookup refused under {net} network was for {hint.target} "
            "(named by the output); add the domain to allow_domains or ask for network=host]"
        )
    verb = "read of" if hint.kind is DenialKind.FILE_READ else "write to"
    where = (
        f"{hint.target} (relative to the directory the tool was in)"
        if hint.relative
        else _shown(hint.target)
    )
    redundant = hint.reason in ("", f"{mode.value} mode")
    why = f"{hint.reason} under {mode.value} mode" if not redundant else f"{mode.value} mode"
    return (
        f"[sandbox hint: the output says a {verb} {where} failed ({why}); no refusal was seen; "
        f"if it was refused: {_file_step(hint)}]"
    )


def result_markers(facts: SandboxFacts | None) -> list[str]:
    """The denials' lines, grouped (a run that succeeded can carry some too: a write git
    reported done but the control plane discarded), a count of any the sources left out,
    then one line per hint."""
    if facts is None:
        return []
    network = facts.network or NetworkMode.HOST
    hints = list(facts.hints)
    if facts.denial_groups:
        lines = []
        for group in facts.denial_groups:
            # A refused lookup names the resolver; the output may name what was looked up.
            names = [h.target for h in hints if h.kind is group.kind is DenialKind.NETWORK_RESOLVE]
            if names:
                hints = [h for h in hints if h.kind is not DenialKind.NETWORK_RESOLVE]
                lines.append(_lookup_marker(group, names, network))
            else:
                lines.append(group_marker(group, facts.mode, network))
        shown = sum(g.count for g in facts.denial_groups)
    else:
        lines = [denial_marker(d, facts.mode, network) for d in facts.denials]
        shown = len(facts.denials)
    extra = facts.denials_total - shown
    # Sources count every refusal, repeats too (a lookup tries A and AAAA), and keep only the
    # first DENIALS_LIMIT each: below that, the difference is repeats, not worth a line.
    if extra > 0 and shown >= DENIALS_LIMIT:
        lines.append(f"[sandbox: {extra} more refusal(s) counted (repeats, or beyond the list)]")
    lines += [hint_marker(h, facts.mode, network) for h in hints]
    return list(dict.fromkeys(lines))


def _lookup_marker(group: DenialGroup, names: list[str], network: NetworkMode | str) -> str:
    resolvers = ", ".join(group.targets) + (
        f" and {group.count - len(group.targets)} more" if group.count > len(group.targets) else ""
    )
    return (
        f"[sandbox: lookup of {', '.join(names)} denied under {NetworkMode(network).value} "
        f"network (the resolver {resolvers} was refused; the name is the output's); "
        f"{_network_step(group)}]"
    )


def git_outcome_text(outcome: GitImportOutcome) -> str:
    """One line per repository whose git state the command changed: applied, or what was
    kept where and why (a conflict or a refusal is never only an exit status)."""
    line = f"git {outcome.status.value}: {outcome.repository}"
    if outcome.kept_at:
        line += f"; the command's commits kept at {outcome.kept_at}"
    reasons = [f"{c.name} changed on both sides" for c in outcome.conflicts]
    reasons += list(outcome.refused)
    if reasons:
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        line += f"; {reasons[0]}{more}"
    return line
