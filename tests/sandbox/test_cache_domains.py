"""Tool caches are shared only within a trust domain (issue 22, item 2), on both backends.

Project A's command plants a "pnpm" where corepack would reuse a cached binary; project B's
command runs whatever its own cache holds at that place. B must not run A's code, and must
not be able to write A's cache; A's next command still finds its own cache warm.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.cache_domains import cache_base, sweep_caches
from bash_sandbox.trust_domain import domain_key
from bash_seam import BashExecRequest, BashRunResult
from policies.paths import within
from tests.sandbox.conftest import ExecutorFactory

_PNPM = "$XDG_CACHE_HOME/node/corepack/v1/pnpm/9.0.0/bin/pnpm"


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "xdg-cache"
    path.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(path))
    return path


async def test_project_b_never_runs_or_writes_project_a_cache(
    make_executor: ExecutorFactory, tmp_path: Path, cache_home: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    ex_a = make_executor(mode="workspace-write", workspace_root=str(a))
    ex_b = make_executor(mode="workspace-write", workspace_root=str(b))
    plant = (
        f'mkdir -p "$(dirname {_PNPM})" && '
        f"printf '#!/bin/sh\\necho pwned > \"$PWD/pwned\"\\n' > {_PNPM} && chmod +x {_PNPM} && "
        'echo "$XDG_CACHE_HOME"'
    )
    planted = await _run(ex_a, plant, a)
    assert planted.exit_code == 0, planted.stderr.text
    a_cache = planted.stdout.text.strip()
    assert a_cache.startswith(str(cache_home)) and os.path.isfile(a_cache + _PNPM[15:])
    run_b = f'if [ -x {_PNPM} ]; then {_PNPM}; else echo cold; fi; echo "$XDG_CACHE_HOME"'
    result = await _run(ex_b, run_b, b)
    assert result.exit_code == 0, result.stderr.text
    out = result.stdout.text.split()
    assert out[0] == "cold" and out[1] != a_cache
    assert not (b / "pwned").exists()
    # B cannot write A's cache either (checked from the host).
    wrote = await _run(ex_b, f"touch {a_cache}/from-b", b)
    assert wrote.exit_code != 0
    assert not os.path.exists(os.path.join(a_cache, "from-b"))
    # A's own next command finds its cache as it left it (warm for the same project).
    again = await _run(ex_a, f"test -x {_PNPM} && echo warm", a)
    assert again.stdout.text.strip() == "warm"


async def test_a_new_executor_of_the_same_project_finds_the_cache(
    make_executor: ExecutorFactory, workspace: Path, cache_home: Path
) -> None:
    first = make_executor(mode="workspace-write")
    made = await _run(
        first, 'mkdir -p "$PIP_CACHE_DIR" && echo hit > "$PIP_CACHE_DIR/w"', workspace
    )
    assert made.exit_code == 0, made.stderr.text
    await first.aclose()
    second = make_executor(mode="workspace-write")
    found = await _run(second, 'cat "$PIP_CACHE_DIR/w"', workspace)
    assert found.stdout.text == "hit\n"
    # Under the host network the same project is another domain: a cold cache.
    wider = make_executor(mode="workspace-write", network="host")
    cold = await _run(wider, 'cat "$PIP_CACHE_DIR/w" || echo cold', workspace)
    assert cold.stdout.text.strip() == "cold"


def test_sweep_removes_old_and_surplus_domains_but_never_a_held_one(
    cache_home: Path,
) -> None:
    base = cache_base()
    os.makedirs(os.path.join(base, ".locks"), exist_ok=True)
    now = time.time()
    keys = [f"{i:032x}" for i in range(5)]
    for age, key in enumerate(keys):
        os.makedirs(os.path.join(base, key, "pip"))
        stamp = os.path.join(base, ".locks", key + ".json")
        Path(stamp).write_text("{}")
        os.utime(stamp, (now - age * 3600, now - age * 3600))
    legacy = os.path.join(os.path.dirname(base), "tools", "npm")
    os.makedirs(legacy)
    # keys[4] is the oldest, but another process holds it.
    held = os.open(os.path.join(base, ".locks", keys[4]), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        removed = sweep_caches(base, max_domains=2, max_age_s=10 * 24 * 3600)
    finally:
        os.close(held)
    assert sorted(removed) == sorted(keys[2:4])
    left = sorted(n for n in os.listdir(base) if not n.startswith("."))
    assert left == sorted([keys[0], keys[1], keys[4]])
    assert not os.path.exists(os.path.dirname(legacy))
    # Too old is removed whatever the count.
    os.utime(os.path.join(base, ".locks", keys[1] + ".json"), (0, 0))
    assert sweep_caches(base, max_domains=10, max_age_s=5 * 3600) == [keys[1]]


def _victim_tree(root: Path) -> list[Path]:
    """Directories outside every writable root, 0755, each with a file."""
    made = []
    for name in ("keep1", "keep2/deeper"):
        path = root / name
        path.mkdir(parents=True)
        (path / "file").write_text("data")
        made.append(path)
    for path in (root, *root.rglob("*")):
        if path.is_dir():
            path.chmod(0o755)
    return made


PLANTS = {
    # A domain-named entry and a trash entry that lead outside: the sweep followed them
    # (chmod 0700 of every directory there, recursively).
    "entries": (
        'B="$XDG_HOME_CACHE/bash-sandbox/caches"; mkdir -p "$B"; '
        'ln -s "$VICTIM" "$B/.trash-planted"; '
        'ln -s "$VICTIM" "$B/0123456789abcdef0123456789abcdef"'
    ),
    # The cache base itself replaced by a link: every directory there was swept away.
    "base": (
        'mv "$XDG_HOME_CACHE/bash-sandbox" "$XDG_HOME_CACHE/moved" && '
        'mkdir -p "$XDG_HOME_CACHE/bash-sandbox" && '
        'ln -s "$VICTIM" "$XDG_HOME_CACHE/bash-sandbox/caches"'
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
async def test_a_cache_home_inside_a_root_never_redirects_the_executor(
    make_executor: ExecutorFactory,
    tmp_path: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    plant: str,
) -> None:
    """Threat-model rows 1 and 15: a workspace that is the user's home (or holds
    `~/.cache`) holds the sandbox's cache home. What a command plants there must never
    lead the executor (its sweep, the next process's cache home) outside the roots: it
    removed or chmodded whatever directory a planted link named."""
    xdg = workspace / ".cache"
    xdg.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    victim = tmp_path / "victim"
    kept = _victim_tree(victim)
    first = make_executor(mode="workspace-write")
    await _run(first, "true", workspace)  # the cache home exists, as after any earlier run
    command = PLANTS[plant].replace("$XDG_HOME_CACHE", str(xdg)).replace("$VICTIM", str(victim))
    await _run(first, command, workspace)
    await first.aclose()
    # The next process (its first cache use sweeps the base), for another project.
    monkeypatch.setattr("bash_sandbox.cache_domains._swept", set())
    other = tmp_path / "other"
    other.mkdir()
    second = make_executor(mode="workspace-write", workspace_root=str(other))
    result = await _run(second, 'echo "$PIP_CACHE_DIR"', other)
    assert result.exit_code == 0, result.stderr.text
    time.sleep(0.5)  # the sweep deletes in a background thread
    for path in kept:
        assert (path / "file").read_text() == "data", path
    for path in (victim, *kept):
        assert os.stat(path).st_mode & 0o777 == 0o755, path
    assert not result.stdout.text.startswith(str(victim))


async def test_a_root_holding_the_cache_home_cannot_write_other_domains(
    make_executor: ExecutorFactory, tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row 20: project B (outside A's roots) keeps its cache in the shared cache home; A's
    root holds that home (A's workspace is the user's home). A must not plant code in B's
    cache, and its own cache is not kept there."""
    xdg = workspace / ".cache"
    xdg.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    b = tmp_path / "b"
    b.mkdir()
    ex_b = make_executor(mode="workspace-write", workspace_root=str(b))
    made = await _run(ex_b, 'mkdir -p "$PIP_CACHE_DIR" && echo "$PIP_CACHE_DIR"', b)
    b_cache = made.stdout.text.strip()
    assert made.exit_code == 0 and b_cache.startswith(str(xdg)), made.stderr.text
    ex_a = make_executor(mode="workspace-write")
    result = await _run(ex_a, f'echo planted > "{b_cache}/evil"; echo "$PIP_CACHE_DIR"', workspace)
    assert not os.path.exists(os.path.join(b_cache, "evil"))
    assert not result.stdout.text.strip().startswith(str(xdg / "bash-sandbox"))


def test_the_sweep_never_follows_a_link_in_the_cache_base(cache_home: Path, tmp_path: Path) -> None:
    """Links in the base (left by a command whose root held it, before it was covered):
    a domain-named link, a trash link, the base itself a link. Nothing they name changes."""
    victim = tmp_path / "victim"
    kept = _victim_tree(victim)
    base = cache_base()
    os.makedirs(os.path.join(base, ".locks"))
    os.symlink(victim, os.path.join(base, "0123456789abcdef0123456789abcdef"))
    os.symlink(victim, os.path.join(base, ".trash-planted"))
    assert sweep_caches(base, max_domains=0, max_age_s=0) == []
    os.rename(base, base + "-moved")
    os.symlink(victim, base)
    assert sweep_caches(base, max_domains=0, max_age_s=0) == []
    time.sleep(0.3)  # the trash is deleted in a background thread
    for path in kept:
        assert (path / "file").read_text() == "data", path
    for path in (victim, *kept):
        assert os.stat(path).st_mode & 0o777 == 0o755, path


@pytest.fixture
def linked_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A home whose `~/.cache` is a link to a folder elsewhere (a dotfile manager, a cache
    on another disk); no XDG_CACHE_HOME, so the sandbox finds its cache through the link."""
    home, real = tmp_path / "home", tmp_path / "disk" / "cache"
    home.mkdir()
    real.mkdir(parents=True)
    (home / ".cache").symlink_to(real)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return home, real


async def test_a_cache_folder_behind_a_link_is_used_through_it(
    make_executor: ExecutorFactory, workspace: Path, linked_cache: tuple[Path, Path]
) -> None:
    """The view shadowed `~/.cache` by its link too (a secret lies below it), stacking an
    empty tmpfs over the real folder: every workspace-write run failed at the cache bind."""
    _, real = linked_cache
    first = make_executor(mode="workspace-write")
    write = 'mkdir -p "$PIP_CACHE_DIR" && echo hit > "$PIP_CACHE_DIR/w" && echo "$PIP_CACHE_DIR"'
    made = await _run(first, write, workspace)
    assert made.exit_code == 0, made.stderr.text
    pip_dir = made.stdout.text.strip()
    assert pip_dir.startswith(str(real / "bash-sandbox" / "caches"))
    assert Path(pip_dir, "w").read_text() == "hit\n"  # on the host, through the real path
    second = make_executor(mode="workspace-write")
    found = await _run(second, 'cat "$PIP_CACHE_DIR/w"', workspace)
    assert found.stdout.text == "hit\n", found.stderr.text


@pytest.mark.parametrize("layout", ["link", "dir"])
async def test_a_root_holding_the_cache_path_cannot_move_another_projects_cache(
    make_executor: ExecutorFactory,
    tmp_path: Path,
    linked_cache: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
) -> None:
    """Row 20: project A's workspace is the user's home, so `~/.cache` (a link out of it,
    or the real folder) is A's to replace. A points it into its own workspace and plants
    project B's cache there (B's key is predictable). B's next process must neither keep
    its cache in A's workspace nor read anything A planted."""
    home, real = linked_cache
    if layout == "dir":
        (home / ".cache").unlink()
        (home / ".cache").mkdir()
        real = home / ".cache"
    b = tmp_path / "b"
    b.mkdir()
    ex_b = make_executor(mode="workspace-write", workspace_root=str(b))
    spec = ex_b.resolve(BashExecRequest(command="true", workdir=str(b)))
    assert spec.sandbox_policy is not None
    key_b = domain_key(spec.sandbox_policy)
    used = await _run(ex_b, 'mkdir -p "$PIP_CACHE_DIR" && echo "$PIP_CACHE_DIR"', b)
    assert used.exit_code == 0 and used.stdout.text.startswith(str(real)), used.stderr.text
    await ex_b.aclose()
    evil = home / "ws" / "evil"
    caches = evil / "bash-sandbox" / "caches"
    attack = (
        f'mkdir -p "{caches}/{key_b}/xdg" "{caches}/.locks"; '
        f'echo planted > "{caches}/{key_b}/xdg/marker"; '
        f'echo "{{}}" > "{caches}/.locks/{key_b}.json"; '
        # A real folder has to be moved away first (it is pinned in A's view).
        + (f'mv -T "{home}/.cache" "{home}/.cache-old"; ' if layout == "dir" else "")
        + f'ln -s "{evil}" "{home}/newlink" && mv -T "{home}/newlink" "{home}/.cache"'
    )
    ex_a = make_executor(mode="workspace-write", workspace_root=str(home))
    await _run(ex_a, attack, home)
    await ex_a.aclose()
    # B's next process (its first cache use sweeps and resolves again).
    monkeypatch.setattr("bash_sandbox.cache_domains._swept", set())
    again = make_executor(mode="workspace-write", workspace_root=str(b))
    probe = 'cat "$XDG_CACHE_HOME/marker" 2>/dev/null || echo cold; echo "$PIP_CACHE_DIR"'
    result = await _run(again, probe, b)
    assert result.exit_code == 0, result.stderr.text
    marker, pip_dir = result.stdout.text.split()
    assert marker == "cold"
    # Where it was: in the folder B used before, never anywhere A made.
    assert within(os.path.realpath(pip_dir), str(real)), pip_dir
    if os.path.realpath(home / ".cache") == str(evil):  # the link was replaced: said so
        assert result.sandbox is not None
        assert any("now leads to" in w for w in result.sandbox.warnings)


async def test_no_command_takes_a_domains_lock_and_a_held_one_never_stalls_a_spawn(
    make_executor: ExecutorFactory, tmp_path: Path, cache_home: Path
) -> None:
    # The lock files were readable inside, and a read-only descriptor takes an exclusive
    # flock: one project's background command held off every later executor of another
    # project's domain, its event loop blocked in a shared flock (red team).
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first_b = make_executor(mode="workspace-write", workspace_root=str(b))
    home = (await _run(first_b, 'echo "$XDG_CACHE_HOME"', b)).stdout.text.strip()
    await first_b.aclose()
    base = cache_base()
    assert base is not None and within(home, base)
    key = os.path.relpath(home, base).split("/")[0]
    lock = os.path.join(base, ".locks", key)
    ex_a = make_executor(mode="workspace-write", workspace_root=str(a))
    probe = await _run(
        ex_a,
        f'python3 -c \'import os, fcntl; fd = os.open("{lock}", os.O_RDONLY); '
        'fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print("locked")\'',
        a,
    )
    assert "locked" not in probe.stdout.text, probe.stderr.text
    # Held exclusively all the same (from the host): b's next executor still runs, its
    # caches in its private /tmp, and the loop never waited on the lock.
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        again = make_executor(mode="workspace-write", workspace_root=str(b))
        result = await asyncio.wait_for(_run(again, 'echo "$XDG_CACHE_HOME"', b), 30)
        assert result.exit_code == 0, result.stderr.text
        assert not result.stdout.text.strip().startswith(base)
    finally:
        os.close(fd)
