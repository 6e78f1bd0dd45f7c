"""What an allowed `.envrc` loads stays the user's (`envrc_chain.py`), with real direnv.

direnv hashes only the `.envrc` it was allowed for, so a command that writes a file the
`.envrc` loads (`source_env_if_exists .envrc.local`, `dotenv_if_exists`, a directory's
`.envrc` by `source_env`) runs its code in the user's next shell that enters the workspace.
The host's own `direnv exec` afterwards is the judge: no marker appears.
"""

from __future__ import annotations

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
    assert not (workspace / ".envrc.local").is_file()
    assert not (workspace / "conf" / "app.env").is_file()
    assert not (workspace / "svc" / ".env").is_file()
    assert (workspace / "sub" / ".envrc").read_text() == "export FROM_SUB=1\n"
    assert result.sandbox is not None, result.stderr
    reasons = {d.target: d.reason for d in result.sandbox.denials}
    assert reasons.get(str(workspace / ".envrc.local")) == "direnv loads it from .envrc", reasons
    assert reasons.get(str(workspace / "svc" / ".env")) == "direnv loads it from svc/.envrc"


async def test_an_envrc_loader_that_bash_would_expand_makes_the_run_partial(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    (workspace / ".envrc").write_text('source_env_if_exists "$PWD/.envrc.$USER"\n')
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    assert result.sandbox is not None
    assert result.sandbox.enforcement == "partial"
    assert any("cannot be resolved" in w for w in result.sandbox.warnings), result.sandbox
