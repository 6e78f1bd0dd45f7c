"""The result's lists: denials bounded, grouped for display, and hints kept apart.

A headless browser's successful run is refused dozens of times (route sockets, DNS,
background services); one line each buries the signal. `group_denials` folds denials of
one kind, reason and place (the directory of a file, a socket family, the network) into a
count with the first few targets, so such a run reads in a few lines; the structured list
stays available to machines, bounded (`flags.bounded_denials`).

`summarize` is what the executor calls once the evidence sources reported: the bounded
denials and their count, the groups over every denial seen, and the hints no denial
already covers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bash_sandbox.facts.flags import DENIALS_LIMIT, bounded_denials
from bash_sandbox.facts.inference import infer_file_hints
from bash_sandbox.facts.network_hints import (
    loopback_destinations,
    loopback_hints,
    resolve_hints,
)
from bash_seam import DenialEvidence, DenialGroup, DenialKind, SandboxDenial, SandboxHint

# Targets a group names; the rest are counted.
GROUP_SAMPLE = 3
# Hints a result carries at most.
HINTS_LIMIT = DENIALS_LIMIT


def denial_place(denial: SandboxDenial) -> str:
    """Where a denial belongs for grouping: a file's directory, a socket's family or
    directory, ``""`` for network destinations (one group per kind and reason)."""
    if denial.kind in (DenialKind.NETWORK_CONNECT, DenialKind.NETWORK_RESOLVE):
        return ""
    if denial.target.startswith("/"):
        return os.path.dirname(denial.target.rstrip("/")) or "/"
    if denial.kind is DenialKind.SOCKET and not denial.target.startswith("@"):
        return denial.target.split(" ", 1)[0]  # "AF_NETLINK type 3" -> "AF_NETLINK"
    return ""


@dataclass
class _Open:
    first: SandboxDenial
    targets: dict[str, None]


def group_denials(denials: Iterable[SandboxDenial]) -> tuple[DenialGroup, ...]:
    """Denials grouped by (kind, reason, place, evidence), in order of first appearance;
    each group counts its distinct targets and names the first `GROUP_SAMPLE`."""
    groups: dict[tuple[DenialKind, str, str, DenialEvidence], _Open] = {}
    for d in denials:
        key = (d.kind, d.reason, denial_place(d), d.evidence)
        group = groups.setdefault(key, _Open(d, {}))
        group.targets.setdefault(d.target, None)
    return tuple(
        DenialGroup(
            kind=kind,
            reason=reason,
            place=place,
            evidence=evidence,
            operation=group.first.operation,
            count=len(group.targets),
            targets=tuple(list(group.targets)[:GROUP_SAMPLE]),
        )
        for (kind, reason, place, evidence), group in groups.items()
    )


def _covered(hint: SandboxHint, denials: Iterable[SandboxDenial]) -> bool:
    """A hint a witnessed denial already says: the same target, or a relative path whose
    named components end a denied one (``../out/build`` and ``/ws/out/build``)."""
    tail = "/".join(p for p in hint.target.split("/") if p not in ("", ".", ".."))
    for d in denials:
        if d.kind is not hint.kind:
            continue
        if d.target == hint.target:
            return True
        if hint.relative and tail and d.target.endswith("/" + tail):
            return True
    return False


@dataclass(frozen=True)
class FactsLists:
    """What `SandboxFacts` carries about refusals."""

    denials: tuple[SandboxDenial, ...]
    total: int
    groups: tuple[DenialGroup, ...]
    hints: tuple[SandboxHint, ...]


def summarize(
    denials: Iterable[SandboxDenial], total: int, hints: Iterable[SandboxHint] = ()
) -> FactsLists:
    """The bounded denials, a total no smaller than what was seen, the groups over every
    distinct denial, and the first hints that no denial covers (each target once)."""
    every, _ = bounded_denials(denials, limit=10**6)
    first = every[:DENIALS_LIMIT]
    kept: dict[tuple[DenialKind, str], SandboxHint] = {}
    for hint in hints:
        if not _covered(hint, every):
            kept.setdefault((hint.kind, hint.target), hint)
    return FactsLists(
        denials=first,
        total=max(total, len(every)),
        groups=group_denials(every),
        hints=tuple(list(kept.values())[:HINTS_LIMIT]),
    )


def collect_hints(
    stdout: str,
    stderr: str,
    *,
    denials: Iterable[SandboxDenial],
    private_loopback: bool,
    loopback_connects: Iterable[str] | None = None,
    **inference: Any,
) -> list[SandboxHint]:
    """Every hint of one command: file refusals its output names (`inference` holds
    `infer_file_hints`' policy, workdir and backend context), the names behind a refused
    lookup, and loopback destinations the host serves (from the supervisor's record of
    loopback connects when given, else from the output)."""
    seen = list(denials)
    destinations = (
        loopback_destinations(stdout, stderr) if loopback_connects is None else loopback_connects
    )
    return [
        *infer_file_hints(stdout, stderr, **inference),
        *resolve_hints(stdout, stderr, seen),
        *loopback_hints(destinations, private_loopback=private_loopback),
    ]
