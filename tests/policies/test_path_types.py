"""One rule per value type, applied the same in every layer; config errors name their key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import bash_seam
from bash_local import LocalBashConfig
from bash_sandbox import SandboxBashConfig
from bash_sandbox.cli import main
from bash_seam import BashExecRequest
from policies import PolicyError, SandboxPolicy, SandboxPolicyService
from policies.types import AbsolutePath, CanonicalPath, PositiveInt


class _Holder(BaseModel):
    path: AbsolutePath = "/"
    canonical: CanonicalPath = "/"
    count: PositiveInt = 1


@pytest.mark.parametrize("bad", ["relative", "", "./x", "/a\x00b"])
def test_absolute_path_rule_is_the_same_in_every_model(bad: str) -> None:
    expected = "contains a NUL byte" if "\x00" in bad else "must be an absolute path"
    attempts = [
        lambda: _Holder(path=bad),
        lambda: LocalBashConfig(cwd=bad),
        lambda: LocalBashConfig(spill_dir=bad),
        lambda: SandboxBashConfig(workspace_root=bad),
        lambda: SandboxPolicy(mode="read-only", workspace_root=bad),
    ]
    for attempt in attempts:
        with pytest.raises(ValidationError, match=expected):
            attempt()
    with pytest.raises(PolicyError, match=f"^cwd {expected}"):
        SandboxPolicyService().resolve(cwd=bad)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "5"])
def test_positive_int_rule_is_the_same_in_every_model(bad: object) -> None:
    for attempt in (
        lambda: _Holder(count=bad),
        lambda: LocalBashConfig(timeout_ms=bad),
        lambda: SandboxBashConfig(probe_timeout_ms=bad),
        lambda: BashExecRequest(command="true", timeout_ms=bad),
    ):
        with pytest.raises(ValidationError):
            attempt()


def test_the_seam_re_exports_the_same_types() -> None:
    assert bash_seam.AbsolutePath is AbsolutePath
    assert bash_seam.PositiveInt is PositiveInt


def test_canonical_path_resolves_symlinks_and_dots(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert _Holder(canonical=f"{tmp_path}/link/../link/.").canonical == os.path.realpath(real)
    assert _Holder(path="/a/../b").path == "/a/../b"  # AbsolutePath keeps what it was given


def test_writable_roots_accept_the_users_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    policy = SandboxPolicyService(
        "workspace-write", str(tmp_path), writable_roots=["~/cache"]
    ).resolve()
    assert policy.writable_roots == (os.path.realpath(home / "cache"),)
    assert os.path.realpath(home / "cache") in policy.all_writable_roots()


def test_missing_writable_root_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    missing = tmp_path / "not-made"
    with pytest.raises(PolicyError) as info:
        SandboxPolicyService("workspace-write", writable_roots=[str(missing)])
    assert str(info.value).startswith(f"writable_roots: {missing} does not exist")
    assert info.value.code == "WRITABLE_ROOT_MISSING"
    assert not missing.exists()
    # Removed after start-up: the next resolve says the same, never "sandbox unavailable".
    made = tmp_path / "made"
    made.mkdir()
    service = SandboxPolicyService("workspace-write", str(tmp_path), writable_roots=[str(made)])
    made.rmdir()
    with pytest.raises(PolicyError, match=r"^writable_roots: "):
        service.resolve()


def test_cli_exits_2_on_a_missing_writable_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = workspace / "ran"
    config = tmp_path / "config.toml"  # outside the workspace: a config the CLI trusts
    config.write_text(f"writable_roots = ['{tmp_path / 'nope'}']\n")
    code = main(
        ["run", "--config", str(config), "--workspace", str(workspace), "--", f"touch {marker}"]
    )
    assert code == 2
    assert "config error: writable_roots[0]: " in capsys.readouterr().err
    assert not marker.exists()


def test_policy_errors_start_with_the_key() -> None:
    for kwargs, key in (
        ({"writable_roots": ["relative"]}, "writable_roots"),
        ({"deny_read": ["relative"]}, "deny_read"),
        ({"protected_paths": ["../x"]}, "protected_paths"),
    ):
        with pytest.raises(PolicyError) as info:
            SandboxPolicyService(**kwargs)  # type: ignore[arg-type]
        assert str(info.value).startswith(f"{key}: ")
