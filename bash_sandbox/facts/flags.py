"""From denials to the contract's flags, and the bounded list a result carries.

`denied` and `network_denied` keep their contract meaning: the run failed on its own
(nonzero exit, not killed by a signal, not a folded ``128+n``) *and* a denial explains it.
File and socket denials make `denied`; network connect and resolve denials make
`network_denied`. A successful run is never denied, whatever was refused on the way. Hints
(what the output only says) never reach these flags.
"""

from __future__ import annotations

from collections.abc import Iterable

from bash_local.spawn import folded_signal
from bash_seam import DenialEvidence, DenialKind, SandboxDenial

# How many denials a result lists; `denials_total` counts the rest.
DENIALS_LIMIT = 16

_SANDBOX_KINDS = frozenset({DenialKind.FILE_WRITE, DenialKind.FILE_READ, DenialKind.SOCKET})
_NETWORK_KINDS = frozenset({DenialKind.NETWORK_CONNECT, DenialKind.NETWORK_RESOLVE})


def failed_on_its_own(exit_code: int | None, signal: str | None, *, folds_signals: bool) -> bool:
    """A nonzero exit that is not a signal (nor, for a folding runner, a folded one)."""
    if signal is not None or exit_code is None or exit_code == 0:
        return False
    # A runner that folds "killed by signal n" into exit 128+n leaves no other trace.
    return not (folds_signals and folded_signal(exit_code) is not None)


def derive_facts_flags(
    denials: Iterable[SandboxDenial],
    exit_code: int | None,
    signal: str | None,
    *,
    folds_signals: bool,
) -> tuple[bool, bool]:
    """``(denied, network_denied)`` for a result, from its denials and how it ended."""
    if not failed_on_its_own(exit_code, signal, folds_signals=folds_signals):
        return False, False
    kinds = {d.kind for d in denials}
    return bool(kinds & _SANDBOX_KINDS), bool(kinds & _NETWORK_KINDS)


# Which source's word wins when two report the same (kind, target): the overlay saw the
# write land and be discarded (so the kernel did not refuse it), then the witnesses, then the
# output (old results only).
_RANK = {DenialEvidence.OVERLAY: 0, DenialEvidence.INFERRED: 2}


def bounded_denials(
    denials: Iterable[SandboxDenial], limit: int = DENIALS_LIMIT
) -> tuple[tuple[SandboxDenial, ...], int]:
    """The first ``limit`` distinct denials and how many distinct ones there were.

    Denials of the same (kind, target) count once, in the place of the first; the one kept
    is the overlay's when it reported it (a write that landed and was discarded), else a
    witness's (supervisor, proxy, kernel) over an inferred one.
    """
    distinct: dict[tuple[DenialKind, str], SandboxDenial] = {}
    for d in denials:
        known = distinct.get((d.kind, d.target))
        if known is None or _RANK.get(d.evidence, 1) < _RANK.get(known.evidence, 1):
            distinct[(d.kind, d.target)] = d
    values = tuple(distinct.values())
    return values[:limit], len(values)
