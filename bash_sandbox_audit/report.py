"""Rendering an `AuditReport`: the attacks x (backend, mode) table, its details, and JSON.

Pure functions of the report: nothing here runs or probes anything, so the exact text and
the JSON shape can be tested with a hand-made report.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from bash_sandbox_audit.model import Verdict
from bash_sandbox_audit.runner import AuditReport, CellResult

_SHORT_MODE = {"read-only": "ro", "workspace-write": "ww"}
# The cell text of each verdict (ESCAPED and BROKEN stay loud on purpose).
_CELL = {
    Verdict.CONTAINED: "contained",
    Verdict.ESCAPED: "ESCAPED",
    Verdict.NOT_ENFORCEABLE: "n/e",
    Verdict.SKIPPED: "skipped",
    Verdict.PASSED: "ok",
    Verdict.BROKEN: "BROKEN",
    Verdict.ERROR: "ERROR",
    Verdict.NOT_APPLICABLE: "-",
}


def column_name(backend: str, mode: str) -> str:
    return f"{backend}/{_SHORT_MODE.get(mode, mode)}"


def _cells_by_key(report: AuditReport) -> dict[tuple[str, str, str], CellResult]:
    return {(r.attack_id, r.backend, r.mode): r for r in report.results}


def render_table(report: AuditReport) -> str:
    """The whole human report: header, table, findings with evidence, reasons, summary."""
    cells = _cells_by_key(report)
    host = report.host
    lines = [
        f"bash-sandbox audit: {len(report.attacks)} attacks x {len(report.columns)} columns "
        f"in {report.seconds:.1f} s (kernel {host.get('kernel', '?')}, Landlock ABI "
        f"{host.get('landlock_abi', '?')}, euid {host.get('euid', '?')})",
    ]
    for probe in report.probes.values():
        state = "usable" if probe.usable else "UNUSABLE"
        lines.append(f"  {probe.backend}: {state} ({probe.detail})")
    lines.append("")
    headers = ["row", "attack"] + [column_name(b, m) for b, m in report.columns]
    rows: list[list[str]] = []
    for attack in report.attacks:
        row = ["ctl" if attack.kind == "control" else str(attack.row), attack.id]
        for backend, mode in report.columns:
            cell = cells.get((attack.id, backend, mode))
            row.append(_CELL[cell.verdict] if cell else "")
        rows.append(row)
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    failed = report.failed
    if failed:
        lines += ["", "Findings (each one fails the audit):"]
        for r in failed:
            lines.append(
                f"  {r.verdict.value} {r.attack_id} [{column_name(r.backend, r.mode)}]: {r.detail}"
            )
            lines += [f"      - {e}" for e in r.evidence[:6]]
    reasons = [r for r in report.results if r.verdict in (Verdict.NOT_ENFORCEABLE, Verdict.SKIPPED)]
    if reasons:
        lines += ["", "Not enforceable / skipped here (never counted as contained):"]
        seen: set[tuple[str, str]] = set()
        for r in reasons:
            key = (r.attack_id, r.detail)
            if key in seen:
                continue
            seen.add(key)
            columns = ", ".join(
                column_name(x.backend, x.mode) for x in reasons if (x.attack_id, x.detail) == key
            )
            because = f" ({r.evidence[0]})" if r.evidence else ""
            lines.append(f"  {_CELL[r.verdict]} {r.attack_id} [{columns}]: {r.detail}{because}")
    lines += ["", summary_line(report)]
    return "\n".join(lines) + "\n"


def summary_counts(report: AuditReport) -> dict[str, int]:
    counts = Counter(
        r.verdict.value for r in report.results if r.verdict is not Verdict.NOT_APPLICABLE
    )
    return {v.value: counts.get(v.value, 0) for v in Verdict if v is not Verdict.NOT_APPLICABLE}


def summary_line(report: AuditReport) -> str:
    counts = summary_counts(report)
    parts = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
    if report.exit_code == 0:
        verdict = "PASS: nothing escaped, every control works"
    else:
        verdict = f"FAIL: {len(report.failed)} finding(s)"
    return f"Summary: {parts}. {verdict} (exit {report.exit_code})"


def as_json_data(report: AuditReport) -> dict[str, Any]:
    """The same data as the table, machine-readable."""
    return {
        "host": report.host,
        "seconds": report.seconds,
        "probes": {
            name: {"usable": p.usable, "detail": p.detail} for name, p in report.probes.items()
        },
        "columns": [{"backend": b, "mode": m} for b, m in report.columns],
        "attacks": [
            {
                "id": a.id,
                "row": a.row,
                "title": a.title,
                "kind": a.kind,
                "modes": sorted(m.value for m in a.modes),
                "backends": sorted(a.backends),
            }
            for a in report.attacks
        ],
        "results": [r.as_dict() for r in report.results],
        "summary": summary_counts(report),
        "exit_code": report.exit_code,
    }


def render_json(report: AuditReport) -> str:
    return json.dumps(as_json_data(report), indent=2) + "\n"
