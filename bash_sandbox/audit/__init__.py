"""`bash-sandbox audit`: every row of the threat model as real attacks on this host.

`attacks.ATTACKS` is the catalog (also run by tests/security), `runner` runs it against each
usable backend and mode and cleans up after itself, `report` renders the results, and
`command.audit_main` is what the CLI calls.
"""

from bash_sandbox.audit.attacks import ATTACKS
from bash_sandbox.audit.command import add_audit_arguments, audit_main
from bash_sandbox.audit.model import Attack, Finding, Verdict
from bash_sandbox.audit.runner import AuditReport, AuditSession, CellResult, run_audit

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
