"""The Landlock backend's compiled PID 1 (`linux/sandbox_init.py`, `native/sandbox_init.c`).

It must behave as the bash it replaces: the command's exit status (128+n for a signal), a
`kill $$` that works, orphans reaped, the namespace ended with the command, stdio passed
through; and it must leave nothing behind in the command (no descriptor, no environment).
Each behaviour is run under both inits, through both of the helper's children.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from bash_sandbox.linux import compiled_child, sandbox_init
from bash_seam import BashExecRequest
from tests.sandbox.conftest import (
    ExecutorFactory,
    processes_naming,
    require_backend,
    sleep_token,
)


@pytest.fixture
def backend() -> str:
    require_backend("landlock")
    return "landlock"


def _require_built() -> None:
    if sandbox_init.built() is None:
        if os.environ.get("CI"):
            pytest.fail("CI has a C compiler: the package's build must have built the init")
        pytest.skip("no compiled init built here: a bash is PID 1")


@pytest.fixture
def built() -> None:
    _require_built()


async def _run(ex: object, command: str, workdir: Path, **fields: object) -> object:
    request = BashExecRequest(command=command, workdir=str(workdir), **fields)  # type: ignore[arg-type]
    return await ex.run(ex.resolve(request))  # type: ignore[attr-defined]


@pytest.mark.parametrize("child", ["compiled-child", "python-child", "compiled-in-executor"])
async def test_pid1_is_the_compiled_init_and_holds_nothing_of_the_helper(
    built: None,
    child: str,
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compiled_child, "ENABLED", child != "python-child")
    # In the helper, or (without it) the compiled child cloned from the executor itself.
    ex = make_executor(mode="workspace-write", spawn_helper=child != "compiled-in-executor")
    probe = (
        "cat /proc/1/comm; readlink /proc/1/exe; ls /proc/1/fd | tr '\\n' ' '; echo;"
        " ls /proc/self/fd | tr '\\n' ' '; echo; echo \"SHLVL=$SHLVL\""
    )
    result = await _run(ex, probe, workspace)
    assert result.exit_code == 0, result.stderr.text  # type: ignore[attr-defined]
    comm, exe, pid1_fds, own_fds, shlvl = result.stdout.text.splitlines()  # type: ignore[attr-defined]
    assert comm == "sandbox-init"
    # The very build of this install, not a bash nor the helper's interpreter.
    assert exe == sandbox_init.built()
    # PID 1 holds the command's stdio only; the held init (`INIT_FD`) closed at its exec.
    assert pid1_fds.split() == ["0", "1", "2"]
    assert str(sandbox_init.INIT_FD) not in own_fds.split()
    # As bwrap's PID 1 and the local executor leave it (a bash PID 1 exported SHLVL=1).
    assert shlvl == "SHLVL=1"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-init", "bash-init"])
async def test_both_inits_keep_the_commands_semantics(
    compiled: bool,
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if compiled:
        _require_built()
    monkeypatch.setattr(sandbox_init, "ENABLED", compiled)
    ex = make_executor(mode="workspace-write", spawn_helper=True)
    pid1 = await _run(ex, "cat /proc/1/comm", workspace)
    assert pid1.stdout.text.strip() == ("sandbox-init" if compiled else "bash")  # type: ignore[attr-defined]

    assert (await _run(ex, "exit 7", workspace)).exit_code == 7  # type: ignore[attr-defined]
    killed = await _run(ex, "echo before; kill $$; echo after", workspace)
    assert killed.exit_code == 143  # type: ignore[attr-defined]
    assert killed.stdout.text == "before\n"  # type: ignore[attr-defined]
    assert (await _run(ex, "kill -9 $$", workspace)).exit_code == 137  # type: ignore[attr-defined]
    # PID 1 ignores what it has no handler for, from inside: the command goes on.
    ignored = await _run(ex, "kill -TERM 1; kill -INT 1; echo alive", workspace)
    assert (ignored.exit_code, ignored.stdout.text) == (0, "alive\n")  # type: ignore[attr-defined]

    streams = await _run(ex, "read -r x; echo out:$x; echo err >&2", workspace, stdin="in\n")
    assert streams.stdout.text == "out:in\n"  # type: ignore[attr-defined]
    assert streams.stderr.text == "err\n"  # type: ignore[attr-defined]

    # An orphan (its parent gone) is reparented onto PID 1, which reaps it: no zombie.
    orphan = await _run(
        ex,
        "(sleep 0.05 & echo $! > orphan.pid); sleep 0.6;"
        " p=$(cat orphan.pid); if [ -e /proc/$p ]; then grep State /proc/$p/status;"
        " else echo reaped; fi",
        workspace,
    )
    assert orphan.stdout.text == "reaped\n", orphan.stdout.text  # type: ignore[attr-defined]

    # What the command leaves running ends with it (the namespace ends with PID 1), judged
    # from the host by the sleep's unique argument.
    token = sleep_token()
    left = await _run(ex, f"sleep {token} >/dev/null 2>&1 & echo started", workspace)
    assert left.stdout.text == "started\n"  # type: ignore[attr-defined]
    assert processes_naming(f"sleep\0{token}") == set()


async def test_the_init_runs_where_the_view_hides_the_package(
    built: None, make_executor: ExecutorFactory, workspace: Path
) -> None:
    """Held before the view is built, it runs even when its directory is denied."""
    package = str(Path(sandbox_init.__file__).parent)
    ex = make_executor(mode="workspace-write", spawn_helper=True, deny_read=(package,))
    result = await _run(ex, f"cat /proc/1/comm; ls {package} 2>&1 | head -1", workspace)
    lines = result.stdout.text.splitlines()  # type: ignore[attr-defined]
    assert result.exit_code == 0, result.stderr.text  # type: ignore[attr-defined]
    assert lines[0] == "sandbox-init"
    assert "sandbox_init.py" not in result.stdout.text  # type: ignore[attr-defined]


def test_a_build_from_another_source_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: None
) -> None:
    source = Path(sandbox_init.__file__).parent / "native" / "sandbox_init.c"
    assert (
        hashlib.sha256(source.read_bytes()).hexdigest().encode()
        in Path(str(sandbox_init.built())).read_bytes()
    )
    changed = tmp_path / "sandbox_init.c"
    changed.write_bytes(source.read_bytes() + b"\n/* changed */\n")
    monkeypatch.setattr(sandbox_init, "_SOURCE", changed)
    sandbox_init.built.cache_clear()
    try:
        assert sandbox_init.built() is None
    finally:
        monkeypatch.undo()
        sandbox_init.built.cache_clear()
    assert sandbox_init.built() is not None


def test_the_init_binary_exits_as_its_child_and_passes_argv_and_environment(
    built: None, tmp_path: Path
) -> None:
    """The build itself, run directly (no sandbox): status, signal, argv, environment."""
    init = str(sandbox_init.built())
    bash = "/bin/bash" if os.path.exists("/bin/bash") else "/usr/bin/bash"

    def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [init, *argv], capture_output=True, text=True, env=env or {}, timeout=30, check=False
        )

    assert run(bash, "-c", "exit 5").returncode == 5
    assert run(bash, "-c", "kill -USR1 $$").returncode == 128 + signal.SIGUSR1
    echoed = run(
        bash, "-c", 'printf "%s|" "$0" "$@"; printf "%s" "$V"', "a b", "'c'", env={"V": "v"}
    )
    assert (echoed.returncode, echoed.stdout, echoed.stderr) == (0, "a b|'c'|v", "")
    # What it cannot run: 127, and nothing written (the command's stderr is not its own).
    for argv in ([str(tmp_path / "missing")], ["bash", "-c", "true"], []):
        failed = run(*argv)
        assert (failed.returncode, failed.stdout, failed.stderr) == (127, "", ""), argv
