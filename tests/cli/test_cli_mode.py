"""`bash-sandbox mode`: show and set a session's sandbox-mode override."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bash_sandbox.cli import main


def mode(session: Path, *args: str) -> int:
    return main(["mode", "--session", str(session), *args])


def test_show_without_override_prints_the_configured_default_and_creates_nothing(
    tmp_path: Path,
    config_home: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(workspace)
    session = tmp_path / "s.jsonl"
    assert mode(session) == 0
    assert capsys.readouterr().out == "default (read-only)\n"
    assert not session.exists()

    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text('mode = "workspace-write"\n')
    assert mode(session) == 0
    assert capsys.readouterr().out == "default (workspace-write)\n"


def test_set_records_one_event_and_show_reports_it(
    tmp_path: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(workspace)
    session = tmp_path / "s.jsonl"
    assert mode(session, "workspace-write") == 0
    assert capsys.readouterr().out == "workspace-write\n"
    events = [json.loads(line) for line in session.read_text().splitlines()]
    assert events == [{"type": "bash/sandbox-mode", "mode": "workspace-write"}]

    assert mode(session) == 0
    assert capsys.readouterr().out == "workspace-write\n"

    assert mode(session, "danger-full-access") == 0
    assert mode(session, "read-only") == 0
    capsys.readouterr()
    assert mode(session) == 0
    assert capsys.readouterr().out == "read-only\n"


def test_unknown_mode_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "s.jsonl"
    assert mode(session, "write-everything") == 2
    err = capsys.readouterr().err
    assert "unknown sandbox mode 'write-everything'" in err
    assert "read-only, workspace-write, danger-full-access" in err
    assert not session.exists()


def test_session_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mode", "read-only"]) == 2
    assert "--session" in capsys.readouterr().err


def test_unwritable_session_path_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mode(tmp_path / "missing-dir" / "s.jsonl", "read-only") == 2
    assert "cannot open session log" in capsys.readouterr().err
