"""What an allowed `.envrc` loads stays the user's (`envrc_chain.py`), with real direnv.

direnv hashes only the `.envrc` it was allowed for, so a command that writes a file the
`.envrc` loads (`source_env_if_exists .envrc.local`, `dotenv_if_exists`, a directory's
`.envrc` by `source_env`) runs its code in the user's next shell that enters the workspace.
The host's own `direnv exec` afterwards is the judge: no marker appears.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory
from tests.workflows.conftest import require_tools


def _direnv(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    direnv = shutil.which("direnv")
    assert direnv is not None
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
    }
    return subprocess.run(
        [direnv, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _allow(workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's direnv allows the workspace's `.envrc` (skipped without direnv)."""
    require_tools("direnv")
    home = tmp_path / "allow-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    assert _direnv(home, "allow", str(workspace)).returncode == 0


async def test_the_files_an_allowed_envrc_loads_are_never_the_commands(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_tools("direnv")
    home = tmp_path / "home"
    home.mkdir()
    # The executor reads the same allow records the user's direnv writes.
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    markers = tmp_path / "markers"
    markers.mkdir()
    (workspace / ".envrc").write_text(
        "source_env_if_exists .envrc.local\n"
        "if [ -d conf ]; then dotenv_if_exists conf/app.env; fi  # the second loader\n"
        "source_env sub\n"
    )
    (workspace / "sub").mkdir()
    (workspace / "sub" / ".envrc").write_text("export FROM_SUB=1\n")
    (workspace / "conf").mkdir()
    # A sub-project's own `.envrc`, allowed by the user on its own: found by its record.
    (workspace / "svc").mkdir()
    (workspace / "svc" / ".envrc").write_text("dotenv\n")
    for path in (workspace, workspace / "svc"):
        allowed = _direnv(home, "allow", str(path))
        assert allowed.returncode == 0, allowed.stderr
    assert _direnv(home, "exec", str(workspace), "true").returncode == 0

    ex = make_executor(mode="workspace-write")
    plant = (
        f"echo 'touch {markers}/envrc-local' > .envrc.local; "
        f"printf '#!/bin/sh\\ntouch {markers}/bash-env\\n' > run.sh; "
        f"echo 'BASH_ENV={workspace}/run.sh' > conf/app.env; "
        f"echo 'touch {markers}/sub' >> sub/.envrc; "
        f"echo 'BASH_ENV={workspace}/run.sh' > svc/.env; "
        "echo ordinary > notes.txt"
    )
    result = await ex.run(ex.resolve(BashExecRequest(command=plant, workdir=str(workspace))))
    # Ordinary work in the workspace still goes through; each loaded file was refused.
    assert (workspace / "notes.txt").read_text() == "ordinary\n"
    # The host: none of those files is the command's, and the user's shell runs nothing.
    for env_dir in (workspace, workspace / "svc"):
        entered = _direnv(home, "exec", str(env_dir), "bash", "-c", "true")
        assert entered.returncode == 0, entered.stderr
    assert sorted(os.listdir(markers)) == []
    assert not (workspace / ".envrc.local").exists()  # the placeholders are gone again
    assert not (workspace / "conf" / "app.env").exists()
    assert not (workspace / "svc" / ".env").exists()
    assert (workspace / "sub" / ".envrc").read_text() == "export FROM_SUB=1\n"
    assert result.sandbox is not None, result.stderr
    reasons = {d.target: d.reason for d in result.sandbox.denials}
    assert reasons.get(str(workspace / ".envrc.local")) == (
        "direnv loads it from .envrc; unprotected_paths lifts it"
    ), reasons
    assert reasons.get(str(workspace / "svc" / ".env")) == (
        "direnv loads it from svc/.envrc; unprotected_paths lifts it"
    )


async def test_an_envrc_loader_that_bash_would_expand_makes_the_run_partial(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (workspace / ".envrc").write_text('source_env_if_exists "$PWD/.envrc.$USER"\n')
    _allow(workspace, tmp_path, monkeypatch)
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    assert result.sandbox is not None
    assert result.sandbox.enforcement == "partial"
    assert any("cannot be followed" in w for w in result.sandbox.warnings), result.sandbox


async def test_source_up_and_a_second_level_loader_hold_what_they_load(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A sub-project's `source_up` sources the first `.envrc` above it: one the command made
    # in between (`a/.envrc`) ran first. And a file an `.envrc` loads may load another
    # (`.envrc.local` -> `sub/.envrc` -> `sub/.envrc.private`). A comment that ends in a
    # backslash does not hide the next line's loader from bash (nor from this reading).
    require_tools("direnv")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    markers = tmp_path / "markers"
    markers.mkdir()
    (workspace / ".envrc").write_text("# local overrides \\\nsource_env_if_exists .envrc.local\n")
    (workspace / ".envrc.local").write_text("source_env_if_exists sub/.envrc\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / ".envrc").write_text("source_env_if_exists .envrc.private\n")
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "b" / ".envrc").write_text("source_up\nexport SUB=1\n")
    for path in (workspace, workspace / "a" / "b"):
        assert _direnv(home, "allow", str(path)).returncode == 0
    ex = make_executor(mode="workspace-write")
    plant = (
        f"echo 'touch {markers}/up' > a/.envrc; "
        f"echo 'touch {markers}/second' > sub/.envrc.private; true"
    )
    result = await ex.run(ex.resolve(BashExecRequest(command=plant, workdir=str(workspace))))
    assert result.exit_code == 0
    for env_dir in (workspace, workspace / "a" / "b"):
        entered = _direnv(home, "exec", str(env_dir), "true")
        assert entered.returncode == 0, entered.stderr
    assert sorted(os.listdir(markers)) == []


@pytest.mark.parametrize(
    "envrc",
    [
        'export GREETING="hello\nworld"; source_env_if_exists .envrc.local\n',
        'dotenv_if_exists "$(pwd)/.env"\n',
        "dotenv_if_exists .env.${STAGE:-dev}\n",
        "dotenv_if_exists env/dev/.env\n",  # its directory missing: nothing is made there
    ],
    ids=["open-quote", "substitution", "expansion", "missing-directory"],
)
async def test_what_this_reading_cannot_follow_makes_the_run_partial(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    envrc: str,
) -> None:
    (workspace / ".envrc").write_text(envrc)
    _allow(workspace, tmp_path, monkeypatch)
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    assert result.sandbox is not None
    assert result.sandbox.enforcement == "partial", result.sandbox
    assert any(w.startswith("direnv: .envrc loads") for w in result.sandbox.warnings)
    assert sorted(os.listdir(workspace)) == [".envrc"]  # nothing made on the host


async def test_ordinary_work_around_an_envrc_stays_possible(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A usability pass: `source .venv/bin/activate` (bash's own source: the project's tools)
    # broke `python -m venv .venv`; an `.envrc` nobody allowed (no direnv) made placeholders;
    # `cp .env.example .env` under `dotenv` failed inside a placeholder directory, and no key
    # lifted it. An unallowed `.envrc` is not followed, bash's `source` is not followed, and
    # `unprotected_paths` lifts a loaded name.
    (workspace / ".env.example").write_text("A=1\n")
    (workspace / ".envrc").write_text("source .venv/bin/activate\ndotenv\n")
    ex = make_executor(mode="workspace-write")
    unallowed = await ex.run(
        ex.resolve(BashExecRequest(command="cp .env.example .env", workdir=str(workspace)))
    )
    assert unallowed.exit_code == 0 and (workspace / ".env").read_text() == "A=1\n"
    (workspace / ".env").unlink()
    _allow(workspace, tmp_path, monkeypatch)
    venv = await ex.run(
        ex.resolve(
            BashExecRequest(
                command="python3 -m venv --without-pip .venv && test -f .venv/bin/activate",
                workdir=str(workspace),
            )
        )
    )
    assert venv.exit_code == 0, venv.stderr.text
    held = await ex.run(
        ex.resolve(BashExecRequest(command="cp .env.example .env", workdir=str(workspace)))
    )
    assert held.exit_code != 0 and ".env" in held.stderr.text
    assert "unprotected_paths" in str(held.sandbox.denials if held.sandbox else "")
    lifted = make_executor(mode="workspace-write", unprotected_paths=(".env",))
    done = await lifted.run(
        lifted.resolve(BashExecRequest(command="cp .env.example .env", workdir=str(workspace)))
    )
    assert done.exit_code == 0, (done.stderr.text, done.sandbox)
    assert (workspace / ".env").read_text() == "A=1\n"


async def test_direnvs_whitelist_makes_a_root_partial_and_covers_an_exact_entry(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # direnv runs every `.envrc` under a whitelist prefix unasked (one a command makes at
    # any depth), and an `exact` one whatever it holds.
    config = tmp_path / "config"
    (config / "direnv").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    (workspace / "svc").mkdir()
    (workspace / "svc" / ".envrc").write_text("export A=1\n")
    toml = f'[whitelist]\nexact = ["{workspace}/svc/.envrc"]\n'
    (config / "direnv" / "direnv.toml").write_text(toml)
    ex = make_executor(mode="workspace-write")
    wrote = await ex.run(
        ex.resolve(BashExecRequest(command="echo x >> svc/.envrc", workdir=str(workspace)))
    )
    assert wrote.exit_code != 0
    assert (workspace / "svc" / ".envrc").read_text() == "export A=1\n"
    (config / "direnv" / "direnv.toml").write_text(f'[whitelist]\nprefix = ["{workspace}"]\n')
    later = await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    assert later.sandbox is not None and later.sandbox.enforcement == "partial"
    assert any("whitelist prefix" in w for w in later.sandbox.warnings)


async def test_an_allowed_envrc_above_the_workspace_holds_what_it_loads_inside(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A monorepo's allowed `.envrc` loads `app/.env`; the workspace is the app. direnv runs
    # the monorepo's `.envrc` in the app too: what it loads from inside the workspace is held.
    require_tools("direnv")
    from bash_sandbox import SandboxBashExecutor

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    mono = tmp_path / "mono"
    app = mono / "app"
    app.mkdir(parents=True)
    (mono / ".envrc").write_text("dotenv_if_exists app/.env\n")
    assert _direnv(home, "allow", str(mono)).returncode == 0
    marker = tmp_path / "ran"
    ex = SandboxBashExecutor(backend=backend, workspace_root=str(app), mode="workspace-write")
    try:
        result = await ex.run(
            ex.resolve(
                BashExecRequest(
                    command=f"printf 'touch {marker}\\n' > evil.sh; "
                    f"printf 'BASH_ENV={app}/evil.sh\\n' > .env",
                    workdir=str(app),
                )
            )
        )
    finally:
        await ex.aclose()
    assert (app / "evil.sh").exists()  # ordinary files in the app are written
    assert not (app / ".env").exists()
    entered = _direnv(home, "exec", str(mono), "bash", "-c", "true")
    assert entered.returncode == 0, entered.stderr
    assert not marker.exists()
    assert result.sandbox is not None
    reasons = {d.target: d.reason for d in result.sandbox.denials}
    assert f"from {mono}/.envrc" in reasons.get(str(app / ".env"), ""), reasons


async def test_a_chain_deeper_than_followed_makes_the_run_partial(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A chain past the depth followed was silently not covered, and the run said `full`.
    lib = workspace / "lib"
    lib.mkdir()
    names = ["a", "b", "c", "d", "e", "f"]
    (workspace / ".envrc").write_text("source_env lib/a.sh\n")
    for name, nxt in itertools.pairwise(names):
        (lib / f"{name}.sh").write_text(f"source_env {nxt}.sh\n")
    (lib / "f.sh").write_text("dotenv_if_exists ../.env.deep\n")
    _allow(workspace, tmp_path, monkeypatch)
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    assert result.sandbox is not None
    assert result.sandbox.enforcement == "partial"
    assert any("levels deep" in w for w in result.sandbox.warnings), result.sandbox.warnings
