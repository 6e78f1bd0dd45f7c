"""The per-session override kit: the event model, the fold, the setter, in-memory sessions."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from policies import (
    SANDBOX_MODE_EVENT_TYPE,
    InMemorySession,
    JsonlSessionLog,
    SandboxMode,
    SandboxModeEvent,
    Session,
    effective_sandbox_mode,
    set_sandbox_mode,
)


def _mode_event(mode: str) -> dict[str, str]:
    return {"type": SANDBOX_MODE_EVENT_TYPE, "mode": mode}


def test_no_sandbox_mode_events_means_no_override() -> None:
    assert effective_sandbox_mode([]) is None
    assert effective_sandbox_mode([{"type": "message", "text": "hi"}, 42, None]) is None


def test_last_sandbox_mode_event_wins() -> None:
    events = [
        _mode_event("workspace-write"),
        {"type": "message", "mode": "read-only"},  # other types are ignored, even with a mode
        _mode_event("danger-full-access"),
        {"type": "tool-call"},
        _mode_event("read-only"),
        "a plain string",
    ]
    assert effective_sandbox_mode(events) is SandboxMode.READ_ONLY


def test_event_models_and_dicts_fold_together() -> None:
    events = [_mode_event("read-only"), SandboxModeEvent(mode=SandboxMode.WORKSPACE_WRITE)]
    assert effective_sandbox_mode(events) is SandboxMode.WORKSPACE_WRITE
    assert effective_sandbox_mode(reversed(events)) is SandboxMode.READ_ONLY


def test_unknown_mode_event_is_skipped_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    events = [
        _mode_event("workspace-write"),
        _mode_event("root"),
        {"type": SANDBOX_MODE_EVENT_TYPE},
    ]
    with caplog.at_level(logging.WARNING, logger="policies"):
        assert effective_sandbox_mode(events) is SandboxMode.WORKSPACE_WRITE
    messages = [r.getMessage() for r in caplog.records if r.name == "policies"]
    assert any("'root'" in m for m in messages)
    assert any("None" in m for m in messages)  # the event without a mode
    assert all("read-only" in m for m in messages)  # the valid modes are named


def test_fold_never_raises_on_odd_events(caplog: pytest.LogCaptureFixture) -> None:
    odd = [_mode_event(3), {"type": SANDBOX_MODE_EVENT_TYPE, "mode": ["read-only"]}, object()]  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="policies"):
        assert effective_sandbox_mode(odd) is None


def test_event_model_is_frozen_and_validated() -> None:
    event = SandboxModeEvent(mode="workspace-write")
    assert event.type == "bash/sandbox-mode" == SANDBOX_MODE_EVENT_TYPE
    assert event.mode is SandboxMode.WORKSPACE_WRITE
    with pytest.raises(ValidationError):
        event.mode = SandboxMode.READ_ONLY  # type: ignore[misc]
    with pytest.raises(ValidationError):
        SandboxModeEvent(mode="root")


def test_set_sandbox_mode_appends_exactly_one_plain_dict() -> None:
    session = InMemorySession([{"type": "message"}])
    result = set_sandbox_mode(session, "workspace-write")
    assert result is SandboxMode.WORKSPACE_WRITE
    assert session.events == [
        {"type": "message"},
        {"type": "bash/sandbox-mode", "mode": "workspace-write"},
    ]
    assert type(session.events[-1]) is dict
    assert effective_sandbox_mode(session.events) is SandboxMode.WORKSPACE_WRITE


def test_set_sandbox_mode_accepts_the_enum() -> None:
    session = InMemorySession()
    assert (
        set_sandbox_mode(session, SandboxMode.DANGER_FULL_ACCESS) is SandboxMode.DANGER_FULL_ACCESS
    )
    assert session.events == [{"type": "bash/sandbox-mode", "mode": "danger-full-access"}]
    assert type(session.events[0]["mode"]) is str


@pytest.mark.parametrize("bad", ["root", "", "READ-ONLY", 1, None])
def test_set_sandbox_mode_rejects_unknown_and_appends_nothing(bad: object) -> None:
    session = InMemorySession([_mode_event("read-only")])
    with pytest.raises(ValueError, match="read-only, workspace-write, danger-full-access"):
        set_sandbox_mode(session, bad)  # type: ignore[arg-type]
    assert session.events == [_mode_event("read-only")]


def test_sessions_satisfy_the_protocol() -> None:
    assert isinstance(InMemorySession(), Session)
    assert not isinstance(object(), Session)


def test_any_object_with_events_and_append_is_a_session() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.events: list[object] = []

        def append(self, event: object, /) -> None:
            self.events.append(event)

    recorder = Recorder()
    assert isinstance(recorder, Session)
    set_sandbox_mode(recorder, "read-only")
    assert effective_sandbox_mode(recorder.events) is SandboxMode.READ_ONLY


def test_jsonl_log_is_a_session(tmp_path: Path) -> None:
    with JsonlSessionLog(tmp_path / "s.jsonl") as log:
        assert isinstance(log, Session)
