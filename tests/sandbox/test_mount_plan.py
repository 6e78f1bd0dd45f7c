"""The shared view: exact operations from a host view, and what inspecting the host finds."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bash_sandbox.backends.mount_plan import (
    GitOverlay,
    HostView,
    MountOp,
    PlaceholderSources,
    Shadow,
    ShadowEntry,
    inspect_protected,
    inspect_shadows,
    make_placeholder_sources,
    render_mount_plan,
    tmp_tops,
    visible,
)
from policies import SandboxPolicy

SOURCES = PlaceholderSources("/s/empty", "/s/denied-dir", "/s/denied-file")


def _policy(ws: Path | str, mode: str = "workspace-write", **kw: object) -> SandboxPolicy:
    return SandboxPolicy(mode=mode, workspace_root=str(ws), deny_read=(), **kw)  # type: ignore[arg-type]


def test_render_orders_tmp_shadows_roots_pins_overlays_covers() -> None:
    view = HostView(
        shadows=(
            Shadow(
                "/h/.config",
                (ShadowEntry("gh", "denied-dir"), ShadowEntry("nvim", "dir")),
            ),
            Shadow(
                "/h",
                (
                    ShadowEntry(".netrc", "denied-file"),
                    ShadowEntry("bin", "symlink", "/usr/bin"),
                    ShadowEntry("notes.txt", "file"),
                ),
            ),
        ),
        tmp_tops=("/tmp/a",),
        overlays=(GitOverlay("/w/.git", "/up", "/wk"),),
        pins=("/w/d",),
        protect=("/w/.git/config",),
        deny_dirs=("/w/secrets",),
        deny_files=("/w/.env",),
    )
    ops = render_mount_plan(_policy("/w"), view, SOURCES, private_tmp="/st/tmp")
    assert ops == (
        MountOp("bind", "/tmp", "/st/tmp", writable=True),
        MountOp("mkdir", "/tmp/a"),
        MountOp("bind", "/tmp/a", "/tmp/a"),
        # shallow first: the deeper shadow refines the shallower one
        MountOp("tmpfs", "/h"),
        MountOp("mkfile", "/h/.netrc"),
        MountOp("bind", "/h/.netrc", "/s/denied-file"),
        MountOp("symlink", "/h/bin", "/usr/bin"),
        MountOp("mkfile", "/h/notes.txt"),
        MountOp("bind", "/h/notes.txt", "/h/notes.txt", optional=True),
        MountOp("readonly", "/h"),
        MountOp("tmpfs", "/h/.config"),
        MountOp("mkdir", "/h/.config/gh"),
        MountOp("bind", "/h/.config/gh", "/s/denied-dir"),
        MountOp("mkdir", "/h/.config/nvim"),
        MountOp("bind", "/h/.config/nvim", "/h/.config/nvim", optional=True),
        MountOp("readonly", "/h/.config"),
        MountOp("bind", "/w", "/w", writable=True),
        MountOp("bind", "/w/d", "/w/d", writable=True),
        MountOp("overlay", "/w/.git", "/w/.git", writable=True, upper="/up", work="/wk"),
        MountOp("bind", "/w/.git/config", "/w/.git/config"),
        MountOp("bind", "/w/secrets", "/s/denied-dir"),
        MountOp("bind", "/w/.env", "/s/denied-file"),
    )


def test_read_only_binds_no_root_writable() -> None:
    ops = render_mount_plan(_policy("/w", "read-only"), HostView(), SOURCES, private_tmp="/st/t")
    assert ops == (MountOp("bind", "/tmp", "/st/t", writable=True),)


def test_tmp_tops_and_visibility_under_a_private_tmp() -> None:
    assert tmp_tops(("/tmp/x/ws", "/srv/y", "/tmp/x/other", "/tmp/z")) == ("/tmp/x", "/tmp/z")
    assert visible("/tmp/x/deep", ("/tmp/x",), True)
    assert not visible("/tmp/bash-sandbox-0", ("/tmp/x",), True)
    assert visible("/tmp/bash-sandbox-0", (), False)
    assert visible("/home/u/.ssh", (), True)


def test_shadows_hold_every_sibling_and_placeholders_for_existing_secrets(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("machine x")
    (home / "notes").write_text("hi")
    os.symlink("/usr/bin", home / "bin")
    denied = (str(home / ".ssh"), str(home / ".netrc"), str(home / ".pgpass"))
    shadows, dirs, files = inspect_shadows(denied, roots=())
    assert shadows == (
        Shadow(
            str(home),
            (
                ShadowEntry(".netrc", "denied-file"),
                ShadowEntry(".ssh", "denied-dir"),
                ShadowEntry("bin", "symlink", "/usr/bin"),
                ShadowEntry("notes", "file"),
            ),
        ),
    )
    # .pgpass does not exist: it simply is not in the shadow, so a later one never shows.
    assert (dirs, files) == ((), ())


def test_a_missing_secret_shadows_its_nearest_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "pip").mkdir()
    shadows, _, _ = inspect_shadows((str(tmp_path / "cache" / "huggingface" / "token"),), ())
    assert [s.directory for s in shadows] == [str(tmp_path / "cache")]
    assert shadows[0].entries == (ShadowEntry("pip", "dir"),)


def test_a_secret_behind_a_linked_directory_shadows_only_the_real_directory(
    tmp_path: Path,
) -> None:
    """`~/.cache` a link elsewhere: a tmpfs mounted at the link lands on its target, over
    the target's own shadow, and its entries came back empty (the cache home's bind failed)."""
    real = tmp_path / "disk" / "cache"
    (real / "pip").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    os.symlink(real, tmp_path / "home" / ".cache")
    shadows, _, _ = inspect_shadows((str(tmp_path / "home/.cache/huggingface/token"),), ())
    assert [s.directory for s in shadows] == [str(real)]
    assert shadows[0].entries == (ShadowEntry("pip", "dir"),)


def test_secrets_inside_a_writable_root_are_covered_where_they_lie(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "keys").mkdir(parents=True)
    (ws / ".env").write_text("X=1")
    denied = (str(ws / "keys"), str(ws / ".env"), str(ws / "missing"))
    shadows, dirs, files = inspect_shadows(denied, roots=(str(ws),))
    assert shadows == ()
    assert (dirs, files) == ((str(ws / "keys"),), (str(ws / ".env"),))


def test_a_home_that_is_a_writable_root_is_never_shadowed(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    shadows, dirs, _ = inspect_shadows((str(tmp_path / ".ssh"),), roots=(str(tmp_path),))
    assert shadows == () and dirs == (str(tmp_path / ".ssh"),)


def test_git_names_go_to_the_overlay_and_other_names_are_covered_or_pinned(
    tmp_path: Path,
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.toml").write_text("x")
    policy = _policy(
        tmp_path, protected_paths=(".git/hooks", ".git/config", "conf/app.toml", "x/y")
    )
    view = inspect_protected(policy, (str(tmp_path / ".git"),))
    assert view.in_git == (
        (str(tmp_path / ".git"), "config", False),
        (str(tmp_path / ".git"), "hooks", True),
    )
    assert view.protect == (str(tmp_path / "conf" / "app.toml"),)
    assert view.pins == (str(tmp_path / "conf"),)
    assert view.missing == ((str(tmp_path / "x"), True),)


def test_read_only_mode_protects_nothing(tmp_path: Path) -> None:
    view = inspect_protected(_policy(tmp_path, "read-only"), ())
    assert (view.protect, view.pins, view.missing) == ((), (), ())


def test_placeholder_sources_have_exact_modes(tmp_path: Path) -> None:
    sources = make_placeholder_sources(str(tmp_path))
    assert stat.S_IMODE(os.stat(sources.empty_dir).st_mode) == 0o555
    assert stat.S_IMODE(os.stat(sources.deny_dir).st_mode) == 0o000
    assert stat.S_IMODE(os.stat(sources.deny_file).st_mode) == 0o000
