"""The security suite runs the audit's own catalog: one source of truth for every attack.

The first test that asks for a result runs every *selected* (attack, backend, mode) cell at
once through the audit runner (the code behind `bash-sandbox audit`, concurrency included),
so the whole suite costs about one audit; each test then asserts its own cell. A backend is
skipped only when its probe says it is unusable AND `CI` is not set: in CI it fails.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from security_cells import Cell

from bash_sandbox_audit.attacks import by_id
from bash_sandbox_audit.runner import AuditSession, CellResult
from policies import SandboxMode
from tests.sandbox.conftest import probe


async def _run_cells(cells: list[Cell]) -> dict[Cell, CellResult]:
    async with AuditSession() as session:
        results = await session.run_cells(
            [(by_id(c.attack_id), c.backend, SandboxMode(c.mode)) for c in cells]
        )
    return dict(zip(cells, results, strict=True))


@pytest.fixture(scope="session")
def audit_results(request: pytest.FixtureRequest) -> dict[Cell, CellResult]:
    """Results of every selected cell, computed once (concurrently) for the session."""
    cells = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and isinstance(callspec.params.get("cell"), Cell):
            cell: Cell = callspec.params["cell"]
            if sys.platform.startswith("linux") and probe(cell.backend).usable:
                cells.append(cell)
    return asyncio.run(_run_cells(cells))
