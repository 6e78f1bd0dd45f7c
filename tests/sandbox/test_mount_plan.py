"""The shared view: exact operations from a host view, and what inspecting the host finds."""

from __future__ import annotations

import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from bash_sandbox.backends.mount_plan import (
    GitOverlay,
    HostView,
    MountOp,
    PlaceholderSources,
    ProtectedView,
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
from policies.autorun import directory_placeholder, needs_placeholder
from policies.paths import within, within_any

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


def _reference_protected(policy: SandboxPolicy, gitdirs: tuple[str, ...]) -> ProtectedView:
    """`inspect_protected` as first written, every question asked of the host afresh with
    os.path: the survey's lstat memo and its shortcut past realpath must answer the same."""
    roots = policy.all_writable_roots()
    protect: list[str] = []
    pins: list[str] = []
    missing: list[tuple[str, bool]] = []
    symlinked: list[str] = []

    def pins_between(root: str, target: str) -> list[str]:
        found, cur = [], root
        for part in os.path.relpath(target, root).split("/")[:-1]:
            cur = os.path.join(cur, part)
            if os.path.isdir(cur) and not os.path.islink(cur):
                found.append(cur)
        return found

    def first_missing(path: str, root: str) -> str | None:
        cur = root
        for part in os.path.relpath(path, root).split("/"):
            cur = os.path.join(cur, part)
            if not os.path.lexists(cur):
                return cur
        return None

    for gitdir in gitdirs:
        owner = next((r for r in roots if within(gitdir, r)), None)
        if owner is not None:
            pins += pins_between(owner, gitdir)
    for root in roots:
        for name in policy.protected_paths:
            lexical = os.path.join(root, name)
            if name == ".git" or name.startswith(".git/"):
                continue
            cur = root
            for part in name.split("/"):
                cur = os.path.join(cur, part)
                if os.path.islink(cur):
                    symlinked.append(cur)
                    break
            resolved = os.path.realpath(lexical)
            pins += pins_between(root, lexical)
            if not within_any(resolved, roots) or within_any(resolved, gitdirs):
                continue
            owner = next(r for r in roots if within(resolved, r))
            first = first_missing(resolved, owner)
            pins += pins_between(owner, resolved if first is None else first)
            if first is None:
                protect.append(resolved)
            elif needs_placeholder(name, root):
                is_dir = first != resolved or name.endswith("/") or directory_placeholder(name)
                missing.append((first, is_dir))
    return ProtectedView(
        protect=tuple(dict.fromkeys(protect)),
        pins=tuple(dict.fromkeys(p for p in pins if not within_any(p, gitdirs))),
        missing=tuple(dict.fromkeys(missing)),
        in_git=(),
        symlinked=tuple(dict.fromkeys(symlinked)),
    )


@pytest.mark.parametrize("seed", range(40))
def test_the_protected_survey_answers_as_plain_lookups_do(tmp_path: Path, seed: int) -> None:
    """Random layouts of the protected names: real, missing, files and directories, links
    inside and out of the root, dangling, a directory that is a link, and a root given
    through a link (the policy resolves it)."""
    rng = random.Random(seed)
    real = tmp_path / "real"
    (real / "ws").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "target.json").write_text("x")
    ws = real / "ws"
    if seed % 4 == 0:
        (tmp_path / "via").symlink_to(real)
        root = tmp_path / "via" / "ws"  # the root itself reached through a link
    else:
        root = ws
    names = (
        ".vscode/tasks.json",
        ".vscode/settings.json",
        ".envrc",
        ".idea/",
        "conf/app.toml",
        "deep/er/x.cfg",
        ".github/workflows/",
        "a/b/c",
        "deploy/secrets.env",
        "deploy/",
    )
    for name in names:
        target = ws / name.rstrip("/")
        choice = rng.randrange(6)
        if choice == 0:
            continue  # missing
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            continue
        if choice == 1:
            target.write_text("x")
        elif choice == 2:
            target.mkdir()
        elif choice == 3:
            target.symlink_to(tmp_path / "outside" / "target.json")  # out of the root
        elif choice == 4:
            target.symlink_to(ws / "conf")  # inside the root (maybe dangling)
        else:
            # Its directory a link to the real one beside it (never the root's own).
            parent, moved = target.parent, target.parent.with_name(target.parent.name + ".real")
            if parent != ws and not parent.is_symlink() and not moved.exists():
                parent.rename(moved)
                parent.symlink_to(moved)
    gitdirs = (str(ws / ".git"),) if seed % 3 == 0 else ()
    if gitdirs:
        (ws / ".git").mkdir(exist_ok=True)
    policy = _policy(root, protected_paths=names)
    got = inspect_protected(policy, gitdirs)
    want = _reference_protected(policy, gitdirs)
    assert (got.protect, got.pins, got.missing, got.symlinked) == (
        want.protect,
        want.pins,
        want.missing,
        want.symlinked,
    )


def _random_change(rng: random.Random, ws: Path, names: tuple[str, ...], outside: Path) -> None:
    """One change a user or a command makes between two spawns."""
    target = ws / rng.choice(names).rstrip("/")
    step = rng.randrange(5)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    elif step == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x")
    elif step == 1:
        target.mkdir(parents=True)
    elif step == 2:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(outside / "target.json")
    elif step == 3 and target.parent != ws and target.parent.is_dir():
        moved = target.parent.with_name(target.parent.name + ".moved")
        if not moved.exists() and not target.parent.is_symlink():
            target.parent.rename(moved)
            target.parent.symlink_to(moved)


@pytest.mark.parametrize("seed", range(12))
def test_a_kept_protected_survey_follows_every_change(tmp_path: Path, seed: int) -> None:
    """The answer kept between spawns (`inspect_protected`'s memo) is the one a fresh
    lookup gives after each change: names made, removed, turned into links; a directory on
    the way replaced by a link; the root's own directory moved and linked back."""
    rng = random.Random(seed)
    real = tmp_path / "real"
    ws = real / "ws"
    ws.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.json").write_text("x")
    names = (".vscode/tasks.json", ".envrc", ".idea/", "conf/app.toml", "deploy/secrets.env")
    policy = _policy(ws, protected_paths=names)
    for _ in range(8):
        got = inspect_protected(policy, ())
        want = _reference_protected(policy, ())
        assert (got.protect, got.pins, got.missing, got.symlinked) == (
            want.protect,
            want.pins,
            want.missing,
            want.symlinked,
        )
        assert inspect_protected(policy, ()) == got  # unchanged: the same answer again
        _random_change(rng, ws, names, outside)
    # The root's directory itself becomes a link to where it was moved: resolved again.
    (tmp_path / "moved").mkdir()
    real.rename(tmp_path / "moved" / "real")
    real.symlink_to(tmp_path / "moved" / "real")
    got = inspect_protected(policy, ())
    want = _reference_protected(policy, ())
    assert (got.protect, got.missing) == (want.protect, want.missing)
