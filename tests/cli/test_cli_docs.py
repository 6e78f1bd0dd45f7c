"""docs/cli.md shows what the CLI prints: every console transcript is run again and compared."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP

from tests.cli.doc_examples import DOC, mismatches, parse, run_page


@pytest.mark.skipif(not HAS_BWRAP, reason="the transcripts were taken with the bwrap backend")
def test_the_documented_transcripts_still_match(tmp_path: Path) -> None:
    if shutil.which("bash-sandbox", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("console script not installed next to the interpreter")
    page = parse(DOC.read_text())
    results = run_page(page, tmp_path / "demo")
    assert len(results) >= 25  # the parser found the transcripts
    problems = mismatches(results)
    assert problems == [], "\n".join(
        ["docs/cli.md is out of date (python -m tests.cli.doc_examples --write):", *problems]
    )
