"""How a test checks that a refused file access was reported, in this build's terms.

A denial needs evidence the command cannot forge. For a write refused by a read-only mount
the only witness is the seccomp supervisor's write watch; without it
(`WRITE_INTENT_WITNESSED`), what the tool printed about it is a *hint* and `denied` stays
false for it. `file_refusal_reported` asks for the witnessed denial when the supervisor
gives one,
and otherwise accepts a witnessed denial (overlay, supervisor) or the hint; either way the
result must name the refusal, so a test using it still fails when nothing does.
"""

from __future__ import annotations

import importlib.util

from bash_seam import DenialEvidence, DenialKind, SandboxFacts

# The supervisor witnesses write-intent calls through its write watch (the seccomp work of
# issue 23); without it, file refusals a tool prints are hints.
WRITE_INTENT_WITNESSED: bool = (
    importlib.util.find_spec("bash_sandbox.linux.write_watch") is not None
)

_FILE_KINDS = (DenialKind.FILE_WRITE, DenialKind.FILE_READ)


def _names(shown: str, relative: bool, target: str | None) -> bool:
    if target is None:
        return True
    return shown == target or (relative and target.endswith("/" + shown.removeprefix("./")))


def file_refusal_reported(
    facts: SandboxFacts | None, target: str | None = None, *, witnessable: bool = True
) -> bool:
    """Whether ``facts`` report a refused file access (of ``target``, when given).

    ``witnessable=False``: a refusal the write watch does not judge (it records writes to
    read-only mounts; a rename of a mount point answers EBUSY, Landlock alone EACCES), which
    only the output names, in either build."""
    if facts is None:
        return False
    witnessed = any(
        d.kind in _FILE_KINDS
        and d.evidence is not DenialEvidence.INFERRED
        and _names(d.target, False, target)
        for d in facts.denials
    )
    if WRITE_INTENT_WITNESSED and witnessable:
        return witnessed
    hinted = any(
        h.kind in _FILE_KINDS and _names(h.target, h.relative, target) for h in facts.hints
    )
    return witnessed or hinted
