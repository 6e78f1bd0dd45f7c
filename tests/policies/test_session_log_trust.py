"""Session logs a command cannot use: planted symlinks, hardlinks, non-log files, bad places.

Each attack is staged for real on the filesystem (the test plays the confined command), and
the outcome is checked from outside: the victim file's bytes and inode are unchanged, and no
event reached the log.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from policies import (
    InMemorySession,
    JsonlSessionLog,
    PolicyError,
    SandboxMode,
    SandboxPolicy,
    SandboxPolicyService,
    SessionLogError,
    check_session_log_location,
    set_sandbox_mode,
)

ESCALATION = {"type": "bash/sandbox-mode", "mode": "danger-full-access"}


def _snapshot(path: Path) -> tuple[bytes, int, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_ino, st.st_mtime_ns, st.st_nlink


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A host file a command would like the harness to truncate or append to."""
    path = tmp_path / "host" / "bashrc"
    path.parent.mkdir()
    path.write_bytes(b"export PATH=/usr/bin\nalias ll='ls -l'\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Where the harness keeps its logs: outside every root."""
    root = tmp_path / "state"
    root.mkdir()
    return root


# --- the file itself -------------------------------------------------------------------------


def test_symlink_planted_in_place_of_the_log_is_refused_and_target_untouched(
    state: Path, victim: Path
) -> None:
    log_path = state / "s.jsonl"
    log_path.symlink_to(victim)
    before = _snapshot(victim)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(log_path)
    assert info.value.code == "SESSION_LOG_SYMLINK"
    assert str(log_path) in str(info.value)
    assert _snapshot(victim) == before
    assert log_path.is_symlink()


def test_dangling_symlink_is_refused_and_its_target_never_created(
    state: Path, tmp_path: Path
) -> None:
    target = tmp_path / "host" / "created-by-host"
    target.parent.mkdir()
    (state / "s.jsonl").symlink_to(target)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(state / "s.jsonl")
    assert info.value.code == "SESSION_LOG_SYMLINK"
    assert not target.exists()


def test_log_swapped_for_a_symlink_after_open_gets_no_append(state: Path, victim: Path) -> None:
    log_path = state / "s.jsonl"
    before = _snapshot(victim)
    with JsonlSessionLog(log_path) as log:
        log.append({"type": "message", "n": 1})
        # The command renames the log away and plants a link to the host file.
        log_path.rename(state / "moved.jsonl")
        log_path.symlink_to(victim)
        with pytest.raises(SessionLogError) as info:
            set_sandbox_mode(log, "danger-full-access")
        assert info.value.code == "SESSION_LOG_REPLACED"
        assert log.events == ({"type": "message", "n": 1},)
    assert _snapshot(victim) == before
    assert (state / "moved.jsonl").read_bytes() == b'{"type":"message","n":1}\n'


def test_hardlinked_log_is_refused_at_open(state: Path, workspace: Path) -> None:
    log_path = state / "s.jsonl"
    with JsonlSessionLog(log_path) as log:
        log.append({"type": "message"})
    os.link(log_path, workspace / "alias.jsonl")
    before = _snapshot(log_path)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(log_path)
    assert info.value.code == "SESSION_LOG_HARDLINKED"
    assert _snapshot(log_path) == before


def test_hardlink_made_after_open_stops_the_next_append(state: Path, workspace: Path) -> None:
    log_path = state / "s.jsonl"
    with JsonlSessionLog(log_path) as log:
        log.append({"type": "message"})
        os.link(log_path, workspace / "alias.jsonl")
        with pytest.raises(SessionLogError) as info:
            log.append(ESCALATION)
        assert info.value.code == "SESSION_LOG_HARDLINKED"
    assert log_path.read_bytes() == b'{"type":"message"}\n'


def test_deleted_log_is_not_appended_to_silently(state: Path) -> None:
    log_path = state / "s.jsonl"
    with JsonlSessionLog(log_path) as log:
        log_path.unlink()
        with pytest.raises(SessionLogError) as info:
            log.append({"type": "message"})
        assert info.value.code == "SESSION_LOG_REPLACED"
    assert not log_path.exists()


def test_log_writable_by_others_is_refused(state: Path) -> None:
    log_path = state / "s.jsonl"
    log_path.write_bytes(b'{"type":"message"}\n')
    log_path.chmod(0o622)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(log_path)
    assert info.value.code == "SESSION_LOG_WRITABLE_BY_OTHERS"
    assert "chmod 600" in str(info.value)
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o622


def test_chmod_after_open_stops_the_next_append(state: Path) -> None:
    log_path = state / "s.jsonl"
    with JsonlSessionLog(log_path) as log:
        log_path.chmod(0o666)
        with pytest.raises(SessionLogError) as info:
            log.append(ESCALATION)
        assert info.value.code == "SESSION_LOG_WRITABLE_BY_OTHERS"
    assert log_path.read_bytes() == b""


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user owns needs root")
def test_log_owned_by_another_user_is_refused(state: Path) -> None:
    log_path = state / "s.jsonl"
    log_path.write_bytes(b'{"type":"message"}\n')
    log_path.chmod(0o600)
    os.chown(log_path, 65534, 65534)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(log_path)
    assert info.value.code == "SESSION_LOG_FOREIGN_OWNER"
    assert log_path.read_bytes() == b'{"type":"message"}\n'


def test_fifo_at_the_log_path_is_refused_without_hanging(state: Path) -> None:
    log_path = state / "s.jsonl"
    os.mkfifo(log_path, 0o600)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(log_path)
    assert info.value.code == "SESSION_LOG_NOT_REGULAR"
    assert stat.S_ISFIFO(log_path.lstat().st_mode)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"hvs.CAESIJ0fake0vault0token", id="token-without-newline"),
        pytest.param(b"export PATH=/usr/bin\nalias ll='ls -l'\n{", id="shell-rc-with-brace-tail"),
        pytest.param(b'{"type":"message"}\n[1, 2]\n{"type": "to', id="non-object-line"),
        pytest.param(b'{"type":"message"}\nnot json\n{"type": "to', id="non-json-line"),
        pytest.param(b'{"type":"message"}\n\n{"type": "to', id="blank-line"),
        pytest.param(b'{"type":"message"}\nexport X=1', id="text-tail"),
    ],
)
def test_non_log_file_with_a_torn_tail_is_never_truncated(state: Path, content: bytes) -> None:
    path = state / "s.jsonl"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(SessionLogError) as info:
        JsonlSessionLog(path)
    assert info.value.code == "SESSION_LOG_NOT_A_LOG"
    assert path.read_bytes() == content


def test_file_turning_into_a_non_log_after_open_is_not_truncated_by_append(state: Path) -> None:
    path = state / "s.jsonl"
    with JsonlSessionLog(path) as log:
        log.append({"type": "message"})
        with open(path, "ab") as raw:
            raw.write(b"plain text\nno newline")
        with pytest.raises(SessionLogError):
            log.append(ESCALATION)
    assert path.read_bytes() == b'{"type":"message"}\nplain text\nno newline'


def test_a_real_torn_log_is_still_repaired(state: Path) -> None:
    path = state / "s.jsonl"
    path.write_bytes(b'{"type":"message","n":1}\n{"type":"bash/sandbox-mo')
    path.chmod(0o600)
    with JsonlSessionLog(path) as log:
        assert log.events == ({"type": "message", "n": 1},)
    assert path.read_bytes() == b'{"type":"message","n":1}\n'


def test_new_log_is_created_0600_through_a_symlinked_parent(tmp_path: Path, state: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(state, target_is_directory=True)
    with JsonlSessionLog(alias / "s.jsonl") as log:
        # The parent is resolved once; the name the host writes is the real one.
        assert log.path == os.path.join(os.path.realpath(state), "s.jsonl")
        log.append({"type": "message"})
    assert stat.S_IMODE((state / "s.jsonl").stat().st_mode) == 0o600
    assert json.loads((state / "s.jsonl").read_bytes()) == {"type": "message"}


# --- where the log lives ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(SandboxMode))
def test_log_inside_the_workspace_is_refused_in_every_mode(workspace: Path, mode: str) -> None:
    service = SandboxPolicyService(mode, str(workspace))
    with JsonlSessionLog(workspace / "s.jsonl") as log:
        with pytest.raises(PolicyError) as info:
            service.resolve(log)
        set_sandbox_mode(log, "workspace-write")
        with pytest.raises(PolicyError):
            service.resolve(log)
    assert info.value.code == "SESSION_LOG_IN_WRITABLE_ROOT"
    message = str(info.value)
    assert str(workspace / "s.jsonl") in message
    assert f"workspace root {os.path.realpath(workspace)}" in message
    assert "outside the workspace" in message


def test_log_inside_a_writable_root_is_refused_even_under_read_only(
    workspace: Path, tmp_path: Path
) -> None:
    extra = tmp_path / "cache"
    (extra / "deep").mkdir(parents=True)
    service = SandboxPolicyService("read-only", str(workspace), writable_roots=[str(extra)])
    with JsonlSessionLog(extra / "deep" / "s.jsonl") as log, pytest.raises(PolicyError) as info:
        service.resolve(log)
    assert info.value.code == "SESSION_LOG_IN_WRITABLE_ROOT"
    assert f"writable root {os.path.realpath(extra)}" in str(info.value)


def test_log_inside_the_configured_root_is_refused_for_a_call_elsewhere(
    workspace: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    service = SandboxPolicyService("read-only", str(workspace))
    with JsonlSessionLog(workspace / "s.jsonl") as log, pytest.raises(PolicyError):
        service.resolve(log, cwd=str(elsewhere))


def test_log_reached_through_a_symlinked_dir_is_judged_by_its_real_place(
    workspace: Path, tmp_path: Path
) -> None:
    alias = tmp_path / "looks-outside"
    alias.symlink_to(workspace, target_is_directory=True)
    service = SandboxPolicyService("read-only", str(workspace))
    with JsonlSessionLog(alias / "s.jsonl") as log, pytest.raises(PolicyError):
        service.resolve(log)


def test_log_outside_every_root_is_obeyed(workspace: Path, state: Path) -> None:
    service = SandboxPolicyService("read-only", str(workspace))
    with JsonlSessionLog(state / "s.jsonl") as log:
        set_sandbox_mode(log, "workspace-write")
        assert service.resolve(log).mode is SandboxMode.WORKSPACE_WRITE
    # A session with no file behind it has no place to check.
    session = InMemorySession()
    set_sandbox_mode(session, "workspace-write")
    assert service.resolve(session).mode is SandboxMode.WORKSPACE_WRITE


def test_check_session_log_location_for_callers_that_resolve_themselves(
    workspace: Path, state: Path
) -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root=str(workspace))
    check_session_log_location(state / "s.jsonl", policy)  # outside: no error
    with pytest.raises(PolicyError) as info:
        check_session_log_location(str(workspace / "sub" / "s.jsonl"), policy)
    assert info.value.code == "SESSION_LOG_IN_WRITABLE_ROOT"
    # A name outside that is a symlink into the workspace counts as inside.
    (state / "link.jsonl").symlink_to(workspace / "s.jsonl")
    with pytest.raises(PolicyError):
        check_session_log_location(state / "link.jsonl", policy)
    with pytest.raises(PolicyError):
        check_session_log_location(state / "s.jsonl", policy, extra_roots=[str(state)])
