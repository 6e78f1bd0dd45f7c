"""Every documented exit status, produced by the real CLI, and the docs read from one table.

`EXIT_STATUSES` is what `run --help`, docs/cli.md and the README show; each of its rows has
at least one case here that runs `bash-sandbox` as a process and checks the status.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP, HAS_LANDLOCK, CliRunner, wait_until

from bash_sandbox.cli.exit_codes import EXIT_STATUSES, exit_status_markdown

ROOT = Path(__file__).resolve().parents[2]
needs_sandbox = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")

# (documented row, extra environment, arguments after `run`, expected status)
CASES = [
    ("0", {}, ["--", "true"], 0),
    ("N", {}, ["--", "exit 3"], 3),
    ("N", {}, ["--", "no-such-command-here"], 127),
    ("N", {}, ["--", "/etc"], 126),
    ("2", {}, ["--no-such-flag", "--", "true"], 2),
    ("2", {}, ["--memory", "1M", "--", "true"], 2),
    # Longer than one exec argument (two words joined): it runs all the same.
    ("0", {}, ["--", "true #" + "x" * 100_000, "y" * 100_000], 0),
    (
        "125",
        {},
        ["--backend", "seatbelt" if sys.platform == "linux" else "bwrap", "--", "true"],
        125,
    ),
    ("126", {"PATH": "/nonexistent"}, ["--", "true"], 126),
    ("128+n", {}, ["--", "kill -USR1 $$"], 128 + signal.SIGUSR1),
    ("128+n", {}, ["--timeout-ms", "300ms", "--", "sleep 30"], 128 + signal.SIGTERM),
]


@needs_sandbox
@pytest.mark.parametrize(
    ("row", "env", "args", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_the_documented_exit_status(
    cli: CliRunner,
    workspace: Path,
    row: str,
    env: dict[str, str],
    args: list[str],
    expected: int,
) -> None:
    runner = CliRunner(cli.argv0, env=cli.env | env)
    try:
        # Bounded: a run that hangs fails here instead of hanging the suite.
        done = runner.run("run", "--workspace", str(workspace), *args, timeout=60)
    finally:
        runner.kill_all()
    assert done.returncode == expected, done.stderr.decode()[-2000:]
    if expected in (2, 125, 126) and row != "N":
        # A refusal is one line, never a traceback.
        assert b"Traceback" not in done.stderr
        assert done.stderr.decode().strip().splitlines()[-1].startswith("bash-sandbox")


@needs_sandbox
@pytest.mark.parametrize(
    ("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_signal_to_bash_sandbox_is_its_own_status_and_json_says_so(
    cli: CliRunner, workspace: Path, sig: signal.Signals, expected: int
) -> None:
    proc = cli.start(
        "run",
        "--json",
        "--mode",
        "workspace-write",
        "--workspace",
        str(workspace),
        "--",
        "touch started; sleep 30",
    )
    wait_until(lambda: (workspace / "started").exists() or proc.poll() is not None, 30)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == expected
    payload = json.loads(out)
    assert payload["outcome"] == "interrupted"
    assert payload["error"]["signal"] == sig.name


@needs_sandbox
def test_json_tells_a_timeout_from_a_signal_from_elsewhere(cli: CliRunner, workspace: Path) -> None:
    timed = cli.run(
        "run", "--json", "--workspace", str(workspace), "--timeout-ms", "300", "--", "sleep 30"
    )
    killed = cli.run("run", "--json", "--workspace", str(workspace), "--", "kill -TERM $$")
    exited = cli.run("run", "--json", "--workspace", str(workspace), "--", "exit 4")
    assert timed.returncode == killed.returncode == 143
    assert json.loads(timed.stdout)["outcome"] == "timed-out"
    # Under bwrap the sandbox's pid 1 reports the signal as status 143, so `exited` is
    # as true as `signal`; what must never happen is reading it as a timeout.
    assert json.loads(killed.stdout)["outcome"] in ("signal", "exited")
    assert json.loads(exited.stdout)["outcome"] == "exited"


def test_every_documented_row_has_a_case() -> None:
    covered = {case[0] for case in CASES} | {"130/143/129", "141"}  # the two tests below
    assert {row.status for row in EXIT_STATUSES} <= covered


@pytest.mark.parametrize("page", ["README.md", "docs/cli.md"])
def test_the_docs_show_the_table_the_cli_uses(page: str) -> None:
    assert exit_status_markdown() in (ROOT / page).read_text()


def test_run_help_shows_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    from bash_sandbox.cli import main

    assert main(["run", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for row in EXIT_STATUSES:
        assert " ".join(f"{row.status} {row.meaning}".split()) in shown


@needs_sandbox
def test_141_is_the_status_when_stdouts_reader_leaves(cli: CliRunner, workspace: Path) -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # nobody reads: the first write gets EPIPE
    try:
        proc = cli.start("run", "--workspace", str(workspace), "--", "yes", stdout=write_fd)
    finally:
        os.close(write_fd)
    assert proc.wait(timeout=60) == 141
