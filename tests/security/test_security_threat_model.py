"""Every row of the threat model, attacked for real on each Linux backend and confined mode.

The attacks are `bash_sandbox_audit.attacks.ATTACKS` (the same catalog `bash-sandbox audit`
runs); each verdict was reached by looking at the host from outside the sandbox: files
compared before and after, victim processes and servers the audit started, processes found
by the run's token. A positive control must still work, or the backend is broken, not safe.
"""

from __future__ import annotations

import pytest
from security_cells import Cell

from bash_sandbox_audit.attacks import ATTACKS
from bash_sandbox_audit.model import CONFINED_MODES, LINUX_BACKENDS, Verdict
from bash_sandbox_audit.runner import CellResult
from tests.sandbox.conftest import require_backend


def _cells(kind: str) -> list[object]:
    return [
        pytest.param(
            Cell(a.id, b, m.value), id=f"{a.id}-{b}-{m.value}", marks=[getattr(pytest.mark, b)]
        )
        for a in ATTACKS
        if a.kind == kind
        for b in LINUX_BACKENDS
        for m in CONFINED_MODES
        if a.applies(b, m)
    ]


def _explain(result: CellResult) -> str:
    lines = [
        f"{result.attack_id} on {result.backend}/{result.mode}: {result.verdict.value}",
        f"  {result.title}",
        f"  {result.detail}",
    ]
    lines += [f"  - {e}" for e in result.evidence]
    return "\n".join(lines)


def _skip_when_not_provable(result: CellResult) -> None:
    # A premise this host cannot build, or a gap the backend itself declares partial, is
    # reported with its reason; it is never counted as contained.
    if result.verdict in (Verdict.SKIPPED, Verdict.NOT_ENFORCEABLE):
        pytest.skip(f"{result.verdict.value}: {result.detail}")


@pytest.mark.parametrize("cell", _cells("attack"))
def test_attack_is_contained_and_host_unchanged(
    cell: Cell, audit_results: dict[Cell, CellResult]
) -> None:
    require_backend(cell.backend)
    result = audit_results[cell]
    _skip_when_not_provable(result)
    assert result.verdict is Verdict.CONTAINED, _explain(result)


@pytest.mark.parametrize("cell", _cells("control"))
def test_positive_control_still_works_under_confinement(
    cell: Cell, audit_results: dict[Cell, CellResult]
) -> None:
    require_backend(cell.backend)
    result = audit_results[cell]
    _skip_when_not_provable(result)
    assert result.verdict is Verdict.PASSED, _explain(result)
