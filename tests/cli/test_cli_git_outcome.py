"""The CLI's one line per repository the import touched: a conflict or a refusal names what
was kept where, whatever the exit status says."""

from __future__ import annotations

from bash_sandbox.cli.main import result_notes
from bash_seam import (
    BashRunResult,
    CollectedOutput,
    GitImportOutcome,
    GitImportStatus,
    GitRefConflict,
    SandboxFacts,
)
from policies import SandboxEnforcement, SandboxMode


def _result(*outcomes: GitImportOutcome) -> BashRunResult:
    facts = SandboxFacts(
        mode=SandboxMode.WORKSPACE_WRITE,
        denied=False,
        enforcement=SandboxEnforcement.FULL,
        git=outcomes,
    )
    empty = CollectedOutput(text="")
    return BashRunResult(
        exit_code=0,
        signal=None,
        timed_out=False,
        aborted=False,
        timeout_ms=1000,
        stdout=empty,
        stderr=empty,
        sandbox=facts,
    )


def test_a_conflict_on_exit_0_is_one_line_naming_the_kept_ref() -> None:
    conflict = GitImportOutcome(
        repository="/ws/.git",
        status=GitImportStatus.CONFLICT,
        kept_at="refs/bash-sandbox/r1",
        conflicts=(GitRefConflict(name="refs/heads/main", host="a" * 40, command="b" * 40),),
    )
    applied = GitImportOutcome(repository="/ws/lib/.git", status=GitImportStatus.APPLIED)
    notes = [n for n in result_notes(_result(conflict, applied), streamed=True) if " git " in n]
    assert notes == [
        "bash-sandbox: git conflict: /ws/.git; the command's commits kept at "
        "refs/bash-sandbox/r1; refs/heads/main changed on both sides",
        "bash-sandbox: git applied: /ws/lib/.git",
    ]
