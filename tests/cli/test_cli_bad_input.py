"""Bad input is a clear, typed error before anything runs, never a hang or a wrong error type.

Each case runs the real CLI as a process under a bounded wait (a regression fails instead
of hanging the suite), then checks the status, the one-line message, that the command did
not run (a marker it would have written is absent) and that the CLI is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from cli_probes import (
    HAS_BWRAP,
    HAS_LANDLOCK,
    CliRunner,
    host_pids_with_argv,
    is_alive,
    wait_until,
)

from bash_local.argv_limits import MAX_ARG_STRLEN
from bash_local.executor import LocalBashExecutor
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.executor import SandboxBashExecutor
from bash_sandbox.linux.supervisor import receive_listener
from bash_seam import BashExecRequest, BashRunResult, CommandTooLargeError, InvalidRequestError
from policies import ResourceLimits
from policies.limits import MIN_MEMORY_BYTES, MIN_OPEN_FILES, MIN_PROCESSES, MIN_TMPFS_BYTES

needs_sandbox = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")
MARKER = "touch ran-marker"


def _refused(cli: CliRunner, workspace: Path, *args: str, config: Path | None = None) -> str:
    """Run `bash-sandbox run ARGS -- MARKER` (workspace-write), assert exit 2 with nothing
    run and the CLI gone; returns the JSON error's message."""
    head = ["--config", str(config)] if config is not None else []
    proc = cli.start(
        *head, "run", "--json", "--mode", "workspace-write", "--workspace", str(workspace), *args
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err.decode()
    assert not is_alive(proc.pid)
    assert not (workspace / "ran-marker").exists()
    assert b"Traceback" not in err
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("bash-sandbox"), lines
    return str(json.loads(out)["error"]["message"])


@needs_sandbox
@pytest.mark.parametrize(
    ("flag", "value", "minimum"),
    [
        ("--memory", "1M", "16M"),
        ("--memory", "10", "16M"),
        ("--memory", "4K", "16M"),
        ("--max-processes", "2", str(MIN_PROCESSES)),
        ("--max-open-files", "5", str(MIN_OPEN_FILES)),
        ("--tmp-size", "1", "1M"),
        ("--shm-size", "1023K", "1M"),
    ],
)
def test_a_limit_below_what_the_sandbox_needs_is_refused_with_the_minimum(
    cli: CliRunner, workspace: Path, flag: str, value: str, minimum: str
) -> None:
    message = _refused(cli, workspace, flag, value, "--", MARKER)
    assert flag in message
    assert f"minimum of {minimum}" in message


@needs_sandbox
def test_a_config_memory_limit_below_the_minimum_is_refused(
    cli: CliRunner, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[limits]\nmemory_bytes = 1000000\n")
    config.chmod(0o600)
    message = _refused(cli, workspace, "--", MARKER, config=config)
    assert "limits.memory_bytes" in message
    assert "minimum of 16M" in message


def test_the_floors_are_the_models_own() -> None:
    """API callers get the same refusal as the CLI: a ValueError at construction."""
    with pytest.raises(ValueError, match="minimum of 16M"):
        ResourceLimits(memory_bytes=MIN_MEMORY_BYTES - 1)
    assert ResourceLimits(memory_bytes="2G").memory_bytes == 2 << 30
    assert ResourceLimits(memory_bytes=MIN_MEMORY_BYTES).memory_bytes == MIN_MEMORY_BYTES
    for field in ("tmp_bytes", "shm_bytes"):
        with pytest.raises(ValueError, match="minimum of 1M"):
            ResourceLimits.model_validate({field: MIN_TMPFS_BYTES - 1})
        assert getattr(ResourceLimits.model_validate({field: "1M"}), field) == MIN_TMPFS_BYTES


@needs_sandbox
def test_the_smallest_accepted_memory_limit_runs_and_honours_its_timeout(
    cli: CliRunner, workspace: Path
) -> None:
    # At the floor the command runs; and a command stuck there still dies on time.
    ran = cli.run("run", "--workspace", str(workspace), "--memory", "16M", "--", "echo ok")
    assert (ran.returncode, ran.stdout) == (0, b"ok\n"), ran.stderr
    stuck = cli.run(
        "run",
        "--json",
        "--workspace",
        str(workspace),
        "--memory",
        "16M",
        "--timeout-ms",
        "500ms",
        "--",
        "sleep 30",
        timeout=30,
    )
    assert json.loads(stuck.stdout)["outcome"] == "timed-out"


def test_a_child_that_died_before_handing_over_its_listener_never_blocks_the_caller() -> None:
    """The hang behind `run --memory 1M`: the child was killed by the limit before it sent
    its seccomp listener, and the executor waited on the socket forever (Python 3.11's
    `recv_fds` drops its MSG_DONTWAIT), deaf to its own timeout and to SIGTERM."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    outcome: list[BaseException | int] = []

    def receive() -> None:
        try:
            outcome.append(receive_listener(ours))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=receive, daemon=True)
    worker.start()
    worker.join(timeout=5)
    try:
        assert not worker.is_alive(), "receive_listener blocked on an empty socket"
        assert isinstance(outcome[0], OSError)
    finally:
        theirs.close()  # also wakes a blocked worker, so the thread never outlives the test
        ours.close()


# -- a command too large for one exec argument -------------------------------------------


@needs_sandbox
def test_a_command_longer_than_one_exec_argument_runs_through_the_cli(
    cli: CliRunner, workspace: Path
) -> None:
    # Two words joined with a space: one word this long could not reach our own argv.
    filler = "x" * (MAX_ARG_STRLEN // 2 + 10)
    done = cli.run(
        "run",
        "--mode",
        "workspace-write",
        "--workspace",
        str(workspace),
        "--",
        f'{MARKER}; echo $# "$0" #{filler}',
        filler,
    )
    assert done.returncode == 0, done.stderr
    assert (workspace / "ran-marker").exists()
    assert done.stdout.decode().split()[0] == "0"  # no positional parameters, as `bash -c`


def _run(confined: bool, backend: str, request: BashExecRequest) -> BashRunResult:
    async def attempt() -> BashRunResult:
        executor = SandboxBashExecutor(backend=backend) if confined else LocalBashExecutor()
        async with executor:
            return await asyncio.wait_for(executor.run(executor.resolve(request)), timeout=30)

    return asyncio.run(attempt())


EXECUTORS = [
    pytest.param(False, "auto", id="local"),
    pytest.param(
        True, "bwrap", id="bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
    ),
    pytest.param(
        True,
        "landlock",
        id="landlock",
        marks=pytest.mark.skipif(not HAS_LANDLOCK, reason="no Landlock"),
    ),
]


@pytest.mark.parametrize(("confined", "backend"), EXECUTORS)
@pytest.mark.parametrize("size", [MAX_ARG_STRLEN - 1, 200_000, 3 << 20])
def test_a_long_command_runs_as_bash_c_would_run_it(
    confined: bool, backend: str, size: int, workspace: Path
) -> None:
    """Over MAX_ARG_STRLEN the command goes through a sealed memfd: the same `$0`, no
    positional parameters, stdin untouched, no descriptor or variable left behind."""
    head = (
        'echo "$0|$#|${__bash_sandbox_command-none}|$(ls /proc/self/fd | wc -l)"; '
        'read -r line; echo "stdin=$line"; exit 7 #'
    )
    command = head + "x" * (size - len(head))
    result = _run(
        confined, backend, BashExecRequest(command=command, workdir=str(workspace), stdin="hi\n")
    )
    short = _run(
        confined,
        backend,
        BashExecRequest(command=head.removesuffix(" #"), workdir=str(workspace), stdin="hi\n"),
    )
    assert result.exit_code == 7, result.stderr.text
    assert result.stdout.text == short.stdout.text
    assert result.stdout.text.splitlines()[1] == "stdin=hi"
    assert "|0|none|" in result.stdout.text


@pytest.mark.parametrize(("confined", "backend"), EXECUTORS)
@pytest.mark.parametrize(
    "env",
    [{"BIG": "y" * (3 << 20)}, {f"V{i}": "v" * 120_000 for i in range(24)}],
    ids=["3MiB-env-value", "3MB-environment"],
)
def test_an_environment_too_large_for_exec_is_command_too_large_never_sandbox_unavailable(
    confined: bool, backend: str, env: dict[str, str], workspace: Path
) -> None:
    with pytest.raises(CommandTooLargeError) as caught:
        _run(confined, backend, BashExecRequest(command="true", env=env, workdir=str(workspace)))
    assert isinstance(caught.value, InvalidRequestError)
    assert not isinstance(caught.value, SandboxUnavailableError)
    assert caught.value.code == "COMMAND_TOO_LARGE"
    assert str(MAX_ARG_STRLEN - 1) in str(caught.value) or "ARG_MAX" in str(caught.value)


def test_the_memfd_is_closed_when_the_command_settles(workspace: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        _run(
            False, "auto", BashExecRequest(command="true #" + "x" * 200_000, workdir=str(workspace))
        )
    assert len(os.listdir("/proc/self/fd")) == before


# -- the workspace -----------------------------------------------------------------------------


@needs_sandbox
@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
def test_the_whole_host_as_workspace_is_a_usage_error(
    cli: CliRunner, tmp_path: Path, mode: str
) -> None:
    proc = cli.start("run", "--json", "--mode", mode, "--workspace", "/", "--", "true")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert b"Traceback" not in err
    assert err.decode().count("\n") == 1  # one line
    error = json.loads(out)["error"]
    assert error["code"] == "WORKSPACE_INVALID"
    assert "cannot be /" in error["message"]


# -- the units grammar and key suggestions in the config file --------------------------------


@needs_sandbox
def test_the_config_file_takes_the_same_units_as_the_flags(
    cli: CliRunner, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('timeout_ms = "2s"\n[limits]\nmemory_bytes = "512M"\ntmp_bytes = "64M"\n')
    config.chmod(0o600)
    done = cli.run(
        "--config", str(config), "run", "--json", "--workspace", str(workspace), "--", "sleep 30"
    )
    result = json.loads(done.stdout)
    assert result["timeout_ms"] == 2000
    assert result["outcome"] == "timed-out"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "[limits]\nmemory = 1\n",
            "limits.memory: unknown key (did you mean limits.memory_bytes?)",
        ),
        ("memory_bytes = 1\n", "memory_bytes: unknown key (did you mean limits.memory_bytes?)"),
        ("timout = 5\n", "timout: unknown key (did you mean timeout_ms?)"),
        ('timeout_ms = "3 parsecs"\n', "timeout_ms: expected a duration such as 500ms, 30s"),
        ('[limits]\nmemory_bytes = "1.5G"\n', "limits.memory_bytes: expected a size such as 512M"),
    ],
)
def test_a_bad_config_value_names_the_real_key(
    body: str, expected: str, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bash_sandbox.cli import main

    config = tmp_path / "config.toml"
    config.write_text(body)
    config.chmod(0o600)
    assert main(["--config", str(config), "run", "--workspace", str(workspace), "--", "true"]) == 2
    assert expected in capsys.readouterr().err
    assert os.path.exists(config)


# -- SIGTERM in every state ---------------------------------------------------------------------


@needs_sandbox
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.4, 0.8, 1.5])
def test_sigterm_at_any_point_of_setup_ends_the_cli_and_the_command(
    cli: CliRunner, workspace: Path, delay: float
) -> None:
    """Wherever the CLI is (imports, config, probes, namespaces, spawn, running) a SIGTERM
    ends it promptly, and nothing it started stays behind."""
    seconds = f"30.{os.getpid()}{int(delay * 1000):04d}"
    proc = cli.start(
        "run", "--workspace", str(workspace), "--memory", "16M", "--", f"sleep {seconds}"
    )
    time.sleep(delay)  # a point in the CLI's life, not a wait for something
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    # 143 once its handler is installed; killed by the default action before that.
    assert proc.returncode in (143, -signal.SIGTERM)
    wait_until(lambda: not host_pids_with_argv(["sleep", seconds]), 15, "the command gone")
