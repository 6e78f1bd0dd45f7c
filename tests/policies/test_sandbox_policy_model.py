"""`SandboxPolicy` validation: canonical absolute roots, relative protected names, known modes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from policies import NetworkMode, SandboxMode, SandboxPolicy, default_deny_read


def test_relative_workspace_root_is_rejected() -> None:
    with pytest.raises(ValidationError, match="absolute"):
        SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root="project")


def test_workspace_root_is_canonicalised(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    policy = SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root=f"{link}/../link/.")
    assert policy.workspace_root == os.path.realpath(real)


@pytest.mark.parametrize("bad", ["../.git/hooks", ".git/../../x", "/etc/passwd", "", "."])
def test_protected_path_escaping_its_root_is_rejected(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValidationError, match="protected_paths"):
        SandboxPolicy(
            mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(tmp_path), protected_paths=(bad,)
        )


def test_protected_paths_default_covers_git_hooks_and_config(tmp_path: Path) -> None:
    policy = SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(tmp_path))
    assert {".git/hooks", ".git/config"} <= set(policy.protected_paths)
    assert policy.deny_read == default_deny_read()


def test_unknown_mode_string_is_rejected_listing_valid_modes(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as info:
        SandboxPolicy(mode="root", workspace_root=str(tmp_path))
    message = str(info.value)
    for valid in ("read-only", "workspace-write", "danger-full-access"):
        assert valid in message
    with pytest.raises(ValueError, match="read-only, workspace-write, danger-full-access"):
        SandboxMode("root")


def test_danger_full_access_forces_host_network(tmp_path: Path) -> None:
    policy = SandboxPolicy(
        mode=SandboxMode.DANGER_FULL_ACCESS,
        workspace_root=str(tmp_path),
        network=NetworkMode.ISOLATED,
    )
    assert policy.network is NetworkMode.HOST
    assert not policy.confined


def test_confined_modes_keep_the_requested_network(tmp_path: Path) -> None:
    for mode in (SandboxMode.READ_ONLY, SandboxMode.WORKSPACE_WRITE):
        policy = SandboxPolicy(mode=mode, workspace_root=str(tmp_path))
        assert policy.network is NetworkMode.ISOLATED
        assert policy.confined


def test_relative_deny_read_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="deny_read"):
        SandboxPolicy(mode="read-only", workspace_root=str(tmp_path), deny_read=("secrets",))


def test_policy_is_frozen(tmp_path: Path) -> None:
    policy = SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root=str(tmp_path))
    with pytest.raises(ValidationError):
        policy.mode = SandboxMode.DANGER_FULL_ACCESS  # type: ignore[misc]


def test_writable_roots_only_count_under_workspace_write(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    root = str(tmp_path)
    write = SandboxPolicy(
        mode=SandboxMode.WORKSPACE_WRITE, workspace_root=root, writable_roots=(str(extra), root)
    )
    assert write.all_writable_roots() == (os.path.realpath(root), os.path.realpath(extra))
    read = SandboxPolicy(
        mode=SandboxMode.READ_ONLY, workspace_root=root, writable_roots=(str(extra),)
    )
    assert read.all_writable_roots() == ()


def test_a_root_named_through_a_link_inside_another_root_is_refused(tmp_path: Path) -> None:
    # A command in workspace `ws` replaced `ws/sub` with a link to a host directory; a later
    # call naming `ws/sub` as a writable root (or as its workspace, with `ws` a root) made
    # the link's target writable, with `full` and no word (found by a red team, both
    # backends). Refused now, naming the link; the real directory can still be named.
    ws, target = tmp_path / "ws", tmp_path / "host" / "tgt"
    ws.mkdir()
    target.mkdir(parents=True)
    (ws / "sub").symlink_to(target)
    ww = SandboxMode.WORKSPACE_WRITE
    with pytest.raises(ValidationError, match=r"symlink .*sub"):
        SandboxPolicy(mode=ww, workspace_root=str(ws), writable_roots=(str(ws / "sub"),))
    with pytest.raises(ValidationError, match=r"symlink .*sub"):
        SandboxPolicy(mode=ww, workspace_root=str(ws / "sub"), writable_roots=(str(ws),))
    named = SandboxPolicy(mode=ww, workspace_root=str(ws), writable_roots=(str(target),))
    assert named.writable_roots == (str(target),)
    # A link outside every root (the usual `/home -> /usr/home`, `~/code -> /data`) is fine,
    # and so is read-only, where no root is writable.
    (tmp_path / "code").symlink_to(ws)
    alone = SandboxPolicy(mode=ww, workspace_root=str(tmp_path / "code"))
    assert alone.workspace_root == str(ws)
    ro = SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root=str(ws),
                       writable_roots=(str(ws / "sub"),))  # fmt: skip
    assert ro.all_writable_roots() == ()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("deny_read", ("/",), "cannot hide '/'"),
        ("deny_read", ("/proc/self/mountinfo",), "own /proc"),
        ("deny_read", ("/dev/shm",), "own /proc"),
        ("deny_read", ("{parent}",), "would hide the root"),
        ("deny_read", ("{ws}",), "would hide the root"),
        ("writable_roots", ("/proc",), "the kernel's own files"),
        ("writable_roots", ("/sys/fs",), "the kernel's own files"),
        ("writable_roots", ("{file}",), "not a directory"),
    ],
)
def test_what_no_backend_can_confine_as_asked_is_the_requests_error(
    tmp_path: Path, field: str, value: tuple[str, ...], message: str
) -> None:
    # Landlock ignored a deny of `/` or in /proc with `enforcement: full`; bwrap failed the
    # spawn as `SandboxUnavailableError`, which tells a harness the host cannot confine.
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "file").write_text("")
    named = tuple(v.format(parent=tmp_path, ws=ws, file=tmp_path / "file") for v in value)
    with pytest.raises(ValidationError, match=message):
        SandboxPolicy(mode="workspace-write", workspace_root=str(ws), **{field: named})  # type: ignore[arg-type]
    # The ordinary neighbours stay fine: a secret beside the root, a missing root to be.
    SandboxPolicy(
        mode="workspace-write",  # type: ignore[arg-type]
        workspace_root=str(ws),
        deny_read=(str(tmp_path / "secret.env"), str(ws / "deploy" / ".env")),
        writable_roots=(str(tmp_path / "later"),),
    )
