"""File hints over the captured corpus: every labelled refusal pointed at, nothing else.

The corpus (``corpus/<case>/``) holds real outputs of real tools run by
``capture_corpus.py`` against real confinement, with hand-written labels. What the output
shows is a hint, never a denial (printed text can be forged); the labels say which
refusals the output points at. A hint with a relative path (as printed) is compared after
joining it to the case's starting directory, which is where these tools ran (none
changes directory). Precision and recall of the file kinds must both be 100%; printed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bash_sandbox.facts import infer_file_hints
from policies import SandboxPolicy

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "case.json").is_file())

Denial = tuple[str, str]


def _run(name: str) -> tuple[set[Denial], set[Denial]]:
    case_dir = CORPUS / name
    case = json.loads((case_dir / "case.json").read_text())
    fields = dict(case["policy"])
    # "@file": a list every case shares, stored once next to the cases.
    if isinstance(fields["deny_read"], str):
        fields["deny_read"] = (CORPUS / fields["deny_read"][1:]).read_text().splitlines()
    found = infer_file_hints(
        (case_dir / "stdout").read_text(),
        (case_dir / "stderr").read_text(),
        policy=SandboxPolicy.model_validate(fields),
        workdir=case["workdir"],
    )
    workdir = case["workdir"]
    predicted = {
        (
            d.kind.value,
            os.path.normpath(os.path.join(workdir, d.target)) if d.relative else d.target,
        )
        for d in found
    }
    expected = {(e["kind"], e["target"]) for e in case["expected"]}
    return predicted, expected


def test_the_corpus_is_large_and_covers_the_tools() -> None:
    tools = set()
    kinds: dict[str, int] = {"denial": 0, "none": 0}
    for name in CASES:
        case = json.loads((CORPUS / name / "case.json").read_text())
        tools.add(case["tool"])
        kinds["denial" if case["expected"] else "none"] += 1
        assert (CORPUS / name / "stdout").exists() and (CORPUS / name / "stderr").exists()
    assert len(CASES) >= 100
    assert kinds["denial"] >= 60 and kinds["none"] >= 25
    expected_tools = {"bash", "coreutils", "python", "node", "npm", "git", "gcc", "make", "pip"}
    assert expected_tools | {"pytest", "cargo", "rustc", "java", "tar"} <= tools


@pytest.mark.parametrize("name", CASES)
def test_case_inference_matches_its_label(name: str) -> None:
    predicted, expected = _run(name)
    assert predicted == expected


def test_precision_and_recall_are_100_percent() -> None:
    true_positive = false_positive = false_negative = 0
    for name in CASES:
        predicted, expected = _run(name)
        true_positive += len(predicted & expected)
        false_positive += len(predicted - expected)
        false_negative += len(expected - predicted)
    precision = true_positive / ((true_positive + false_positive) or 1)
    recall = true_positive / ((true_positive + false_negative) or 1)
    print(
        f"\ncorpus: {len(CASES)} cases, {true_positive + false_negative} labelled refusals "
        "(hints); "
        f"precision {precision:.1%}, recall {recall:.1%}"
    )
    assert true_positive > 0
    assert (precision, recall) == (1.0, 1.0)
