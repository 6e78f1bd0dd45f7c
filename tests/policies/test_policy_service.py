"""`SandboxPolicyService.resolve`: mode precedence, workspace-root precedence, canonical roots."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from policies import (
    DEFAULT_PROTECTED_PATHS,
    InMemorySession,
    JsonlSessionLog,
    NetworkMode,
    PolicyError,
    SandboxMode,
    SandboxPolicyService,
    default_deny_read,
    set_sandbox_mode,
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root


def _real(path: Path) -> str:
    return os.path.realpath(path)


# --- mode precedence ---------------------------------------------------------------------


def test_default_mode_applies_without_session_or_argument(workspace: Path) -> None:
    policy = SandboxPolicyService(workspace_root=str(workspace)).resolve()
    assert policy.mode is SandboxMode.READ_ONLY
    assert policy.network is NetworkMode.ISOLATED


def test_session_override_beats_default(workspace: Path) -> None:
    service = SandboxPolicyService("read-only", str(workspace))
    session = InMemorySession()
    assert service.resolve(session).mode is SandboxMode.READ_ONLY
    set_sandbox_mode(session, "workspace-write")
    assert service.resolve(session).mode is SandboxMode.WORKSPACE_WRITE


def test_mode_argument_beats_session_override(workspace: Path) -> None:
    service = SandboxPolicyService("read-only", str(workspace))
    session = InMemorySession()
    set_sandbox_mode(session, "workspace-write")
    policy = service.resolve(session, mode="danger-full-access")
    assert policy.mode is SandboxMode.DANGER_FULL_ACCESS
    # An approved per-call mode may also be narrower than the session's.
    assert service.resolve(session, mode=SandboxMode.READ_ONLY).mode is SandboxMode.READ_ONLY


def test_unknown_session_override_falls_back_to_default(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = SandboxPolicyService("read-only", str(workspace))
    session = InMemorySession([{"type": "bash/sandbox-mode", "mode": "root"}])
    with caplog.at_level(logging.WARNING, logger="policies"):
        assert service.resolve(session).mode is SandboxMode.READ_ONLY
    assert any("'root'" in r.getMessage() for r in caplog.records)


def test_durable_session_override_survives_reopen(workspace: Path, tmp_path: Path) -> None:
    service = SandboxPolicyService(workspace_root=str(workspace))
    with JsonlSessionLog(tmp_path / "s.jsonl") as log:
        set_sandbox_mode(log, "workspace-write")
    with JsonlSessionLog(tmp_path / "s.jsonl") as log:
        assert service.resolve(log).mode is SandboxMode.WORKSPACE_WRITE


def test_unknown_mode_argument_is_rejected(workspace: Path) -> None:
    service = SandboxPolicyService(workspace_root=str(workspace))
    with pytest.raises(ValueError, match="read-only, workspace-write, danger-full-access"):
        service.resolve(mode="root")


def test_danger_full_access_sees_the_host_network(workspace: Path) -> None:
    service = SandboxPolicyService("danger-full-access", str(workspace), "isolated")
    assert service.resolve().network is NetworkMode.HOST
    assert service.resolve(mode="read-only").network is NetworkMode.ISOLATED


def test_configured_host_network_is_kept(workspace: Path) -> None:
    service = SandboxPolicyService(workspace_root=str(workspace), network="host")
    assert service.resolve().network is NetworkMode.HOST


# --- workspace root precedence -------------------------------------------------------------


def test_process_cwd_is_the_last_resort(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    assert SandboxPolicyService().resolve().workspace_root == _real(workspace)


def test_configured_root_beats_process_cwd(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert SandboxPolicyService(workspace_root=workspace).resolve().workspace_root == _real(
        workspace
    )


def test_session_cwd_beats_configured_root(workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    service = SandboxPolicyService(workspace_root=str(workspace))
    session = InMemorySession(cwd=str(other))
    assert service.resolve(session).workspace_root == _real(other)


def test_session_without_cwd_uses_configured_root(workspace: Path) -> None:
    service = SandboxPolicyService(workspace_root=str(workspace))
    assert service.resolve(InMemorySession()).workspace_root == _real(workspace)


def test_cwd_argument_beats_session_cwd(workspace: Path, tmp_path: Path) -> None:
    session_dir = tmp_path / "session"
    call_dir = tmp_path / "call"
    session_dir.mkdir()
    call_dir.mkdir()
    service = SandboxPolicyService(workspace_root=str(workspace))
    session = InMemorySession(cwd=str(session_dir))
    assert service.resolve(session, cwd=str(call_dir)).workspace_root == _real(call_dir)
    assert service.resolve(cwd=call_dir).workspace_root == _real(call_dir)


def test_symlinked_roots_are_canonicalised(workspace: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(workspace, target_is_directory=True)
    extra = tmp_path / "extra"
    extra.mkdir()
    extra_link = tmp_path / "extra-link"
    extra_link.symlink_to(extra, target_is_directory=True)
    service = SandboxPolicyService("workspace-write", str(link), writable_roots=[str(extra_link)])
    policy = service.resolve()
    assert policy.workspace_root == _real(workspace)
    assert policy.writable_roots == (_real(extra),)
    assert service.resolve(cwd=str(link / ".." / "link")).workspace_root == _real(workspace)
    assert service.resolve(InMemorySession(cwd=str(link))).workspace_root == _real(workspace)


@pytest.mark.parametrize("source", ["cwd", "session", "configured"])
def test_missing_root_is_a_policy_error(tmp_path: Path, source: str) -> None:
    missing = str(tmp_path / "gone")
    service = SandboxPolicyService(workspace_root=missing if source == "configured" else None)
    session = InMemorySession(cwd=missing) if source == "session" else None
    with pytest.raises(PolicyError, match="does not exist") as info:
        service.resolve(session, cwd=missing if source == "cwd" else None)
    assert info.value.code == "POLICY_INVALID"
    assert isinstance(info.value, ValueError)


def test_dangling_symlink_root_is_a_policy_error(tmp_path: Path) -> None:
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(PolicyError, match="does not exist"):
        SandboxPolicyService().resolve(cwd=str(link))


def test_file_root_is_a_policy_error(tmp_path: Path) -> None:
    file = tmp_path / "file.txt"
    file.write_text("x")
    with pytest.raises(PolicyError, match="not a directory"):
        SandboxPolicyService().resolve(cwd=str(file))


@pytest.mark.parametrize("relative", ["workspace", ".", "", "../x"])
def test_relative_cwd_is_rejected(workspace: Path, relative: str) -> None:
    service = SandboxPolicyService(workspace_root=str(workspace))
    with pytest.raises(PolicyError, match="absolute"):
        service.resolve(cwd=relative)
    with pytest.raises(PolicyError, match="absolute"):
        service.resolve(InMemorySession(cwd=relative))


def test_unusable_session_cwd_is_an_error_not_a_fallback(workspace: Path) -> None:
    class OddSession(InMemorySession):
        cwd = 42  # type: ignore[assignment]

    service = SandboxPolicyService(workspace_root=str(workspace))
    session = OddSession()
    del session.cwd  # expose the class attribute
    with pytest.raises(PolicyError, match=r"session\.cwd"):
        service.resolve(session)


def test_deleted_process_cwd_is_a_policy_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    monkeypatch.chdir(doomed)
    doomed.rmdir()
    with pytest.raises(PolicyError, match="no longer exists"):
        SandboxPolicyService().resolve()


# --- configuration -----------------------------------------------------------------------


def test_invalid_default_mode_is_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="read-only, workspace-write, danger-full-access"):
        SandboxPolicyService(default_mode="full-access")


def test_invalid_network_is_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="'isolated' or 'host'"):
        SandboxPolicyService(network="bridged")


def test_relative_configured_root_is_rejected_at_construction() -> None:
    with pytest.raises(PolicyError, match="absolute"):
        SandboxPolicyService(workspace_root="relative/dir")


def test_bad_path_lists_are_rejected_at_construction() -> None:
    with pytest.raises(PolicyError, match="protected_paths"):
        SandboxPolicyService(protected_paths=["../escape"])
    with pytest.raises(PolicyError, match="writable_roots"):
        SandboxPolicyService(writable_roots=["relative"])
    with pytest.raises(PolicyError, match="deny_read"):
        SandboxPolicyService(deny_read=["relative"])
    with pytest.raises(PolicyError, match="list of paths"):
        SandboxPolicyService(writable_roots="/tmp")


def test_deny_read_none_keeps_the_policy_default(workspace: Path) -> None:
    policy = SandboxPolicyService(workspace_root=str(workspace)).resolve()
    assert policy.deny_read == default_deny_read()
    assert policy.protected_paths == DEFAULT_PROTECTED_PATHS


def test_explicit_lists_are_passed_through(workspace: Path) -> None:
    service = SandboxPolicyService(
        workspace_root=str(workspace),
        deny_read=["/secrets"],
        protected_paths=[".git/hooks", ".env"],
    )
    policy = service.resolve()
    assert policy.deny_read == ("/secrets",)
    assert policy.protected_paths == (".git/hooks", ".env")
    empty = SandboxPolicyService(workspace_root=str(workspace), deny_read=[]).resolve()
    assert empty.deny_read == ()
