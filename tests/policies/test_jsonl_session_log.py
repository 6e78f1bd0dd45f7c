"""`JsonlSessionLog`: durable append-only JSON lines that survive crashes and stay parseable."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies import (
    JsonlSessionLog,
    SandboxMode,
    SandboxModeEvent,
    effective_sandbox_mode,
    set_sandbox_mode,
)

# Appends forever; says "ready" once `ready_after` events are durable, so the parent can kill
# it mid-stream without sleeping. The padding makes each write large enough to tear.
WRITER = """
import sys
from policies import JsonlSessionLog
path, tag = sys.argv[1], sys.argv[5]
pad_bytes, ready_after, limit = (int(a) for a in sys.argv[2:5])
log = JsonlSessionLog(path)
pad = "x" * pad_bytes
seq = 0
while limit < 0 or seq < limit:
    log.append({"type": "tick", "writer": tag, "seq": seq, "pad": pad})
    seq += 1
    if seq == ready_after:
        print("ready", flush=True)
log.close()
"""


def _policies_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "policies" and r.levelno >= logging.WARNING
    ]


def _raw_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "session.jsonl"


@pytest.fixture
def umask_zero() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_events_are_replayed_on_reopen(log_path: Path) -> None:
    with JsonlSessionLog(log_path) as log:
        log.append({"type": "message", "text": "héllo\nworld"})
        set_sandbox_mode(log, "workspace-write")
        log.append(SandboxModeEvent(mode=SandboxMode.READ_ONLY))
        live = log.events
    with JsonlSessionLog(log_path) as reopened:
        assert (
            reopened.events
            == live
            == (
                {"type": "message", "text": "héllo\nworld"},
                {"type": "bash/sandbox-mode", "mode": "workspace-write"},
                {"type": "bash/sandbox-mode", "mode": "read-only"},
            )
        )
        assert effective_sandbox_mode(reopened.events) is SandboxMode.READ_ONLY
    # One JSON object per line, newlines inside strings escaped.
    lines = _raw_lines(log_path)
    assert len(lines) == 3
    assert all(isinstance(json.loads(line), dict) for line in lines)


def test_log_file_is_created_owner_only(log_path: Path, umask_zero: None) -> None:
    with JsonlSessionLog(log_path) as log:
        assert log.path == str(log_path)
        log.append({"type": "message"})
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600


def test_log_file_stays_writable_under_a_strict_umask(log_path: Path) -> None:
    old = os.umask(0o277)
    try:
        log = JsonlSessionLog(log_path)
    finally:
        os.umask(old)
    with log:
        log.append({"type": "message"})
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    with JsonlSessionLog(log_path) as reopened:
        assert len(reopened.events) == 1


def test_torn_last_line_is_dropped_and_later_appends_stay_parseable(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with JsonlSessionLog(log_path) as log:
        log.append({"type": "message", "n": 1})
        set_sandbox_mode(log, "workspace-write")
    # A crash mid-append: part of a line, no newline.
    with open(log_path, "ab") as raw:
        raw.write(b'{"type": "bash/sandbox-mode", "mo')

    with (
        caplog.at_level(logging.WARNING, logger="policies"),
        JsonlSessionLog(log_path) as second,
    ):
        assert second.events == (
            {"type": "message", "n": 1},
            {"type": "bash/sandbox-mode", "mode": "workspace-write"},
        )
        second.append({"type": "message", "n": 2})
    warnings = _policies_warnings(caplog)
    assert len(warnings) == 1
    assert "torn" in warnings[0]

    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="policies"),
        JsonlSessionLog(log_path) as third,
    ):
        assert third.events == (
            {"type": "message", "n": 1},
            {"type": "bash/sandbox-mode", "mode": "workspace-write"},
            {"type": "message", "n": 2},
        )
    assert _policies_warnings(caplog) == []
    assert all(isinstance(json.loads(line), dict) for line in _raw_lines(log_path))


def test_torn_line_left_by_another_writer_is_dropped_before_appending(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with JsonlSessionLog(log_path) as log:
        log.append({"type": "message", "n": 1})
        # Another process dies mid-line while this log is open.
        with open(log_path, "ab") as raw:
            raw.write(b'{"type": "mess')
        with caplog.at_level(logging.WARNING, logger="policies"):
            log.append({"type": "message", "n": 2})
        assert any("torn" in m for m in _policies_warnings(caplog))
    assert [json.loads(line)["n"] for line in _raw_lines(log_path)] == [1, 2]


def test_torn_file_without_any_newline_is_emptied(log_path: Path) -> None:
    log_path.write_bytes(b'{"type": "mess')
    log_path.chmod(0o600)
    with JsonlSessionLog(log_path) as log:
        assert log.events == ()
        log.append({"type": "message"})
    assert log_path.read_bytes() == b'{"type":"message"}\n'


def test_invalid_middle_line_is_reported_and_skipped(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_path.write_bytes(
        b'{"type": "message", "n": 1}\n'
        b"not json at all\n"
        b"\n"
        b"[1, 2]\n"
        b'\xff\xfe{"bad": "utf8"}\n'
        b'{"type": "message", "n": 2}\n'
    )
    with caplog.at_level(logging.WARNING, logger="policies"), JsonlSessionLog(log_path) as log:
        assert log.events == ({"type": "message", "n": 1}, {"type": "message", "n": 2})
    warnings = _policies_warnings(caplog)
    assert len(warnings) == 3  # the blank line is not worth a warning
    assert "line 2" in warnings[0]
    assert "line 4" in warnings[1]
    assert "line 5" in warnings[2]


def test_unknown_mode_line_is_kept_but_never_trusted(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with JsonlSessionLog(log_path) as log:
        set_sandbox_mode(log, "read-only")
    with open(log_path, "ab") as raw:
        raw.write(b'{"type": "bash/sandbox-mode", "mode": "root"}\n')
    with caplog.at_level(logging.WARNING, logger="policies"), JsonlSessionLog(log_path) as log:
        assert log.events[-1] == {"type": "bash/sandbox-mode", "mode": "root"}
        assert effective_sandbox_mode(log.events) is SandboxMode.READ_ONLY
    assert any("'root'" in m for m in _policies_warnings(caplog))


def test_two_logs_never_see_each_other(tmp_path: Path) -> None:
    with JsonlSessionLog(tmp_path / "a.jsonl") as a, JsonlSessionLog(tmp_path / "b.jsonl") as b:
        set_sandbox_mode(a, "danger-full-access")
        b.append({"type": "message"})
        assert effective_sandbox_mode(a.events) is SandboxMode.DANGER_FULL_ACCESS
        assert effective_sandbox_mode(b.events) is None
        assert b.events == ({"type": "message"},)
    with JsonlSessionLog(tmp_path / "b.jsonl") as b_again:
        assert b_again.events == ({"type": "message"},)


def test_unserialisable_event_is_rejected_and_nothing_written(log_path: Path) -> None:
    with JsonlSessionLog(log_path) as log:
        with pytest.raises(TypeError):
            log.append({"type": "message", "payload": object()})
        with pytest.raises(ValueError):
            log.append({"type": "message", "value": float("nan")})
        with pytest.raises(TypeError, match="JSON objects"):
            log.append(["not", "an", "object"])
        assert log.events == ()
    assert log_path.read_bytes() == b""


def test_closed_log_refuses_appends(log_path: Path) -> None:
    log = JsonlSessionLog(log_path)
    log.close()
    log.close()  # idempotent
    assert log.closed
    with pytest.raises(ValueError, match="closed"):
        log.append({"type": "message"})
    assert log_path.read_bytes() == b""


def test_killed_writer_leaves_a_parseable_log(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(log_path), str(256 * 1024), "20", "-1", "k"],
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"ready\n"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL

    data = log_path.read_bytes()
    complete, _, tail = data.rpartition(b"\n")
    # Every complete line parses; at most the unterminated tail is torn.
    assert [json.loads(line)["seq"] for line in complete.split(b"\n")] == list(
        range(complete.count(b"\n") + 1)
    )

    with caplog.at_level(logging.WARNING, logger="policies"), JsonlSessionLog(log_path) as log:
        seqs = [e["seq"] for e in log.events]
        assert len(seqs) >= 20
        assert seqs == list(range(len(seqs)))
        log.append({"type": "message", "after": "crash"})
    assert bool(tail) == any("torn" in m for m in _policies_warnings(caplog))

    with JsonlSessionLog(log_path) as third:
        assert third.events[-1] == {"type": "message", "after": "crash"}
        assert len(third.events) == len(seqs) + 1


def test_concurrent_writers_never_interleave_lines(log_path: Path) -> None:
    per_writer = 40
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(log_path), str(64 * 1024), "0", str(per_writer), tag]
        )
        for tag in ("a", "b", "c")
    ]
    for w in writers:
        assert w.wait() == 0

    with JsonlSessionLog(log_path) as log:
        assert len(log.events) == 3 * per_writer
        for tag in ("a", "b", "c"):
            assert [e["seq"] for e in log.events if e["writer"] == tag] == list(range(per_writer))
