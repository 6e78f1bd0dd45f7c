"""Tool caches are shared only within a trust domain (issue 22, item 2), on both backends.

Project A's command plants a "pnpm" where corepack would reuse a cached binary; project B's
command runs whatever its own cache holds at that place. B must not run A's code, and must
not be able to write A's cache; A's next command still finds its own cache warm.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.cache_domains import cache_base, sweep_caches
from bash_seam import BashExecRequest, BashRunResult
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
