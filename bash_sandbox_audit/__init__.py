"""`bash-sandbox audit`: every row of the threat model as real attacks on this host.

`attacks.ATTACKS` is the catalog (also run by tests/security), `runner` runs it against each
usable backend and mode and cleans up after itself, `report` renders the results, and
`command.audit_main` is what the CLI calls.

Nothing is imported eagerly: `bash-sandbox run` imports `command.add_audit_arguments` to
build its parser, and must not pay for (or depend on) the attack catalog.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bash_sandbox_audit.attacks import ATTACKS
    from bash_sandbox_audit.command import add_audit_arguments, audit_main
    from bash_sandbox_audit.model import Attack, Finding, Verdict
    from bash_sandbox_audit.runner import AuditReport, AuditSession, CellResult, run_audit

# Public name -> the submodule that defines it, imported on first access (PEP 562).
_LAZY = {
    "ATTACKS": "attacks",
    "Attack": "model",
    "AuditReport": "runner",
    "AuditSession": "runner",
    "CellResult": "runner",
    "Finding": "model",
    "Verdict": "model",
    "add_audit_arguments": "command",
    "audit_main": "command",
    "run_audit": "runner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ATTACKS",
    "Attack",
    "AuditReport",
    "AuditSession",
    "CellResult",
    "Finding",
    "Verdict",
    "add_audit_arguments",
    "audit_main",
    "run_audit",
]
