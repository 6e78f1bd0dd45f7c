"""`bash-sandbox run`: output, exit status, denial markers, --json, backends and sessions.

Most tests call `main()` in process (capsys sees what a terminal would); outcomes are
checked from outside the sandbox: a denied file is absent, an allowed one is present.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP, HAS_LANDLOCK, CliRunner

from bash_sandbox.cli.main import exit_status, main
from bash_seam import BashRunResult, CollectedOutput
from policies import JsonlSessionLog, network_denial_marker, sandbox_denial_marker
from tests.facts.evidence import WRITE_INTENT_WITNESSED

pytestmark = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")

needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bwrap not installed")
needs_landlock = pytest.mark.skipif(not HAS_LANDLOCK, reason="kernel without Landlock")


def run(workspace: Path, *args: str) -> int:
    return main(["run", "--workspace", str(workspace), *args])


def test_stdout_and_stderr_are_printed_as_they_are(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(workspace, "--", "printf 'out\\n'; printf 'err' >&2")
    out, err = capsys.readouterr()
    assert code == 0
    assert out == "out\n"
    assert err == "err"


def test_exit_status_is_the_commands(workspace: Path) -> None:
    assert run(workspace, "--", "exit 7") == 7
    assert run(workspace, "--", "true") == 0


def test_several_words_are_joined_and_one_word_is_used_as_is(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(workspace, "--", "echo", "a", "b") == 0
    assert run(workspace, "--", "echo a; echo b") == 0
    assert capsys.readouterr().out == "a b\na\nb\n"


def test_read_only_write_is_denied_with_marker_and_host_unchanged(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(workspace, "--mode", "read-only", "--", "echo x > f")
    err = capsys.readouterr().err
    assert code != 0
    if WRITE_INTENT_WITNESSED:
        # The contract's line, then the one naming what was refused and the next step.
        generic, specific = err.splitlines()[-2:]
        assert generic == sandbox_denial_marker("read-only")
        assert specific.startswith(f"[sandbox: write to {workspace / 'f'} denied under read-only")
    else:
        # Only bash's own words say so: a hint, which a harness never takes for a denial.
        specific = err.splitlines()[-1]
        assert sandbox_denial_marker("read-only") not in err
        assert specific.startswith("[sandbox hint: the output says a write to f (relative")
    assert specific.endswith("ask for workspace-write]")
    assert not (workspace / "f").exists()


def test_workspace_write_allows_a_write_in_the_workspace(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(workspace, "--mode", "workspace-write", "--", "echo x > f")
    assert code == 0
    assert (workspace / "f").read_text() == "x\n"
    assert "[sandbox:" not in capsys.readouterr().err


def test_workspace_defaults_to_the_current_directory(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workspace)
    code = main(["run", "--mode", "workspace-write", "--", "pwd; echo x > here"])
    assert code == 0
    assert capsys.readouterr().out == f"{workspace}\n"
    assert (workspace / "here").exists()


def test_isolated_network_refusal_prints_the_network_marker(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 192.0.2.0/24 is TEST-NET-1: unroutable anyway, and there is no route at all inside.
    code = run(workspace, "--", "echo > /dev/tcp/192.0.2.1/80")
    err = capsys.readouterr().err
    assert code != 0
    assert network_denial_marker() in err.splitlines()


def test_json_prints_the_whole_result_and_no_marker(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(workspace, "--json", "--mode", "read-only", "--", "echo hi; echo x > f")
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert code == data["exit_code"] == 1
    assert set(data) >= {
        "exit_code",
        "signal",
        "timed_out",
        "aborted",
        "timeout_ms",
        "stdout",
        "stderr",
        "sandbox",
    }
    assert data["stdout"] == {"text": "hi\n", "truncated": False, "spill_path": None}
    assert data["signal"] is None and data["timed_out"] is False and data["aborted"] is False
    sandbox = data["sandbox"]
    assert set(sandbox) >= {"mode", "denied", "enforcement", "backend", "network"}
    assert sandbox["mode"] == "read-only" and sandbox["denied"] is WRITE_INTENT_WITNESSED
    if not WRITE_INTENT_WITNESSED:
        assert [h["target"] for h in sandbox["hints"]] == ["f"]
    assert sandbox["network"] == "isolated"
    assert sandbox["backend"] in ("bwrap", "landlock")
    assert err == ""


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("bwrap", marks=[needs_bwrap, pytest.mark.bwrap]),
        pytest.param("landlock", marks=[needs_landlock, pytest.mark.landlock]),
    ],
)
def test_each_linux_backend_runs_and_confines(
    backend: str, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(
        workspace,
        "--backend",
        backend,
        "--mode",
        "workspace-write",
        "--json",
        "--",
        "echo ok > inside && ! echo x > ../outside",
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["sandbox"]["backend"] == backend
    assert (workspace / "inside").exists()
    assert not (workspace.parent / "outside").exists()


def test_timeout_exits_with_the_killing_signal(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(workspace, "--timeout-ms", "200", "--", "sleep 30")
    assert code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert "timed out after 200 ms" in capsys.readouterr().err


def test_session_override_applies_without_a_mode_flag(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "session.jsonl"
    assert main(["mode", "--session", str(session), "workspace-write"]) == 0
    capsys.readouterr()
    code = run(workspace, "--session", str(session), "--json", "--", "echo x > f")
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["sandbox"]["mode"] == "workspace-write"
    assert (workspace / "f").exists()


def test_mode_flag_beats_the_session_override(workspace: Path, tmp_path: Path) -> None:
    session = tmp_path / "session.jsonl"
    with JsonlSessionLog(session) as log:
        log.append({"type": "bash/sandbox-mode", "mode": "workspace-write"})
    code = run(workspace, "--session", str(session), "--mode", "read-only", "--", "echo x > f")
    assert code != 0
    assert not (workspace / "f").exists()


def test_unavailable_backend_exits_125_and_runs_nothing(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if sys.platform == "darwin":
        pytest.skip("Seatbelt is available on macOS")
    code = run(workspace, "--backend", "seatbelt", "--mode", "workspace-write", "--", "touch ran")
    err = capsys.readouterr().err
    assert code == 125
    assert err.startswith("bash-sandbox: sandbox unavailable for workspace-write mode")
    assert len(err.splitlines()) == 1
    assert not (workspace / "ran").exists()


def test_unavailable_backend_with_json_prints_an_error_object(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if sys.platform == "darwin":
        pytest.skip("Seatbelt is available on macOS")
    code = run(workspace, "--backend", "seatbelt", "--json", "--", "true")
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 125
    assert error["code"] == "SANDBOX_UNAVAILABLE" and error["exit_code"] == 125


def test_missing_workspace_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--workspace", str(tmp_path / "nope"), "--", "true"])
    assert code == 2
    assert "is not an existing directory" in capsys.readouterr().err


def test_run_without_a_command_is_a_usage_error(workspace: Path) -> None:
    assert run(workspace) == 2


# -- as a real process -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("auto"),
        pytest.param("landlock", marks=[needs_landlock]),
    ],
)
def test_command_killed_by_signal_exits_128_plus_n(
    backend: str, cli: CliRunner, workspace: Path
) -> None:
    # bwrap folds a signal death into exit 128+n itself; either way the CLI exits 137.
    done = cli.run(
        "run", "--backend", backend, "--workspace", str(workspace), "--", "kill -KILL $$"
    )
    assert done.returncode == 128 + signal.SIGKILL


def test_exit_codes_through_the_console_script(cli: CliRunner, workspace: Path) -> None:
    script = Path(sys.executable).parent / "bash-sandbox"
    if not script.exists():
        pytest.skip("console script not installed next to the interpreter")
    runner = CliRunner([str(script)], env=cli.env)
    try:
        assert runner.run("run", "--workspace", str(workspace), "--", "exit 7").returncode == 7
        bad = runner.run("run", "--mode", "bogus", "--", "true")
        assert bad.returncode == 2
        assert b"unknown sandbox mode 'bogus'" in bad.stderr
    finally:
        runner.kill_all()


# -- exit status, pure -----------------------------------------------------------------------


def _result(exit_code: int | None, sig: str | None) -> BashRunResult:
    empty = CollectedOutput(text="")
    return BashRunResult(
        exit_code=exit_code,
        signal=sig,
        timed_out=False,
        aborted=False,
        timeout_ms=1,
        stdout=empty,
        stderr=empty,
    )


@pytest.mark.parametrize(
    ("exit_code", "sig", "expected"),
    [
        (0, None, 0),
        (7, None, 7),
        (None, "SIGKILL", 137),
        (None, "SIGTERM", 143),
        (None, "SIG40", 168),
        (None, None, 1),
    ],
)
def test_exit_status_follows_the_shell_convention(
    exit_code: int | None, sig: str | None, expected: int
) -> None:
    assert exit_status(_result(exit_code, sig)) == expected


def test_the_sandboxs_warnings_follow_the_output_on_stderr(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A repository the command makes gets git's default control plane back: the CLI says
    # what the reset took away.
    command = "git init -q sub && git -C sub config core.fsmonitor true && echo made"
    code = run(workspace, "--mode", "workspace-write", "--", command)
    out, err = capsys.readouterr()
    assert code == 0 and out == "made\n"
    assert (workspace / "sub" / ".git").is_dir()
    warning = err.splitlines()[-1]
    assert warning.startswith("bash-sandbox: warning: git: the command created git repositories")
    assert str(workspace / "sub") in warning and "core.fsmonitor" in warning


def test_stdin_reaches_the_command_only_when_asked(
    cli: CliRunner, workspace: Path, tmp_path: Path
) -> None:
    # `git diff | bash-sandbox run --stdin -- 'patch -p1'`: without the flag the command's
    # input is empty (a harness's own stdin may never end), with it the whole input.
    import subprocess

    given = tmp_path / "input"
    given.write_bytes(b"b\na\n\x00binary\n")
    argv = [*cli.argv0, "run", "--workspace", str(workspace)]
    with given.open("rb") as fh:
        copied = subprocess.run(
            [*argv, "--stdin", "--json", "--", "cat"],
            stdin=fh, env=cli.env, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    assert json.loads(copied.stdout)["stdout"]["text"] == "b\na\n\x00binary\n"
    with given.open("rb") as fh:
        unasked = subprocess.run(
            [*argv, "--", "wc -c"], stdin=fh, env=cli.env, capture_output=True, timeout=60,
            check=False,
        )  # fmt: skip
    assert unasked.stdout.strip() == b"0"
