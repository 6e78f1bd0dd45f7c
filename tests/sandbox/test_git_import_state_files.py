"""The rebase, am and sequencer state a command leaves, read as git reads it: todo lists with
`exec`, merge strategies that are not git's own (in every spelling git's config parser
accepts), options git passes to other programs. Each refused; git's own state kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from bash_sandbox.git_import.state_files import StateRefused, check_state_file, parse_reflog

EVIL_OPTS = [
    "[options]\n\tstrategy = evil\n",
    "[options]\n\tStrategy = evil\n",
    "[options] strategy = evil\n",
    "\ufeff[options]\n\tstrategy = ours x/evil\n",  # a BOM: git skips it, a regex did not
    '[options]\n\tstrategy = "ours x/evil"\n',
    "[OPTIONS]\n\tSTRATEGY = evil\n",
    "[options]\n\tstrategy = ort\n\tstrategy = evil\n",
    "[options]\n\texec = touch /tmp/x\n",
    "[options]\n\tgpg-sign = -Sattacker\n",
]

_A, _Z = "a" * 40, "0" * 40  # an object id, the null one


@pytest.mark.parametrize("text", EVIL_OPTS)
def test_sequencer_options_git_would_act_on_are_refused(text: str, tmp_path: Path) -> None:
    path = tmp_path / "opts"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(StateRefused):
        check_state_file("sequencer/opts", str(path), path.read_bytes())


def test_sequencer_options_are_rewritten_from_what_git_parsed(tmp_path: Path) -> None:
    path = tmp_path / "opts"
    path.write_text('\ufeff[options] strategy = ort\n\tstrategy-option = "the\\"irs"\n')
    checked = check_state_file("sequencer/opts", str(path), path.read_bytes())
    assert checked.data == b'[options]\n\tstrategy = "ort"\n\tstrategy-option = "the\\"irs"\n'


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("rebase-merge/git-rebase-todo", "pick 1234 a\nexec touch /tmp/pwned\n"),
        ("rebase-merge/git-rebase-todo", "pick 1234 a\n  x make\n"),
        ("sequencer/todo", "pick 1234 a\nfrobnicate 1234\n"),
        ("rebase-merge/strategy", "evil\n"),
        ("rebase-merge/gpg_sign_opt", "-Sattacker\n"),
        ("rebase-merge/gpg_sign_opt", "-S\n"),  # the user's own key, on `--continue`
        ("rebase-apply/apply-opt", " '--unsafe-paths' '--directory=../..'\n"),
        ("rebase-merge/hooks", "x\n"),
        ("sequencer/../config", "x\n"),
        # Git finishing (or aborting) the rebase writes the ref these name: a control file.
        ("rebase-merge/head-name", "shallow\n"),
        ("rebase-apply/head-name", f"refs/replace/{_A}\n"),
        ("rebase-merge/head-name", "refs/heads/a..b\n"),
        (
            "rebase-merge/update-refs",
            f"info/grafts\n{_Z}\n{_A}\n",
        ),
        (
            "rebase-merge/update-refs",
            f"refs/heads/ok\n{_Z}\n{_A}\nshallow\n{_Z}\n{_A}\n",
        ),
        (
            "rebase-merge/update-refs",
            f"refs/heads/ok\nHEAD~1\n{_A}\n",
        ),
        ("rebase-merge/onto", "HEAD~3\n"),
        ("rebase-apply/orig-head", "--all\n"),
    ],
)
def test_state_files_that_run_or_reach_something_are_refused(
    rel: str, text: str, tmp_path: Path
) -> None:
    path = tmp_path / "f"
    path.write_text(text)
    with pytest.raises(StateRefused):
        check_state_file(rel, str(path), path.read_bytes())


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("rebase-merge/git-rebase-todo", "pick 1234 a\n# exec comment\nfixup -C 1234 b\n"),
        ("rebase-merge/strategy", "ort\n"),
        ("rebase-merge/onto", f"{_A}\n"),
        ("rebase-merge/head-name", "refs/heads/topic\n"),
        ("rebase-apply/head-name", "detached HEAD\n"),
        (
            "rebase-merge/update-refs",
            f"refs/heads/a\n{_A}\n{_Z}\n",
        ),
        ("rebase-merge/stopped-sha", "1234abc\n"),
        ("rebase-merge/gpg_sign_opt", ""),
        ("sequencer/abort-safety", ""),
        ("rebase-apply/0001", "From 1234\nSubject: x\n"),
    ],
)
def test_gits_own_state_is_kept(rel: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text(text)
    assert check_state_file(rel, str(path), path.read_bytes()).data == text.encode()


def test_a_reflog_is_reparsed_and_entries_naming_nothing_dropped() -> None:
    a, b, z = "a" * 40, "b" * 40, "0" * 40
    text = f"{z} {a} t <t@e> 1700000000 +0000\tcommit (initial): x\n{a} {b} t <t@e> 1 -0130\n"
    data, oids = parse_reflog(text.encode(), 40)
    assert data == text.encode() and oids == [a, b]
    assert parse_reflog(text.encode(), 40, frozenset({b}))[0] == text.splitlines(True)[0].encode()
    with pytest.raises(StateRefused):
        parse_reflog(b"not a reflog\n", 40)
