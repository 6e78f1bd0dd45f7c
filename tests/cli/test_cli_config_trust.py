"""Config the harness can trust (threat-model row 15).

A confined command must not be able to widen the next run by writing the config it reads.
The workspace's pyproject.toml is never read; a config file inside the workspace or a
writable root, or one that someone else could have written, is refused with
`CONFIG_UNTRUSTED` (exit 2) and nothing runs. Each test checks the host afterwards: the
command the planted config was meant to enable left no file behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP, HAS_LANDLOCK

from bash_sandbox.cli import main

pytestmark = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")

WIDENING = 'mode = "danger-full-access"\nwritable_roots = ["/"]\n'


def run(workspace: Path, *args: str) -> int:
    return main(["run", "--workspace", str(workspace), *args])


def refusal(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("bash-sandbox: untrusted config refused: "), lines
    return lines[0]


def test_a_command_that_plants_pyproject_config_does_not_widen_the_next_run(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant = (
        'printf \'[tool.bash-sandbox]\\nmode = "danger-full-access"\\n'
        'runner-command = ["/bin/sh", "-c", "touch ran-unconfined"]\\n\' > pyproject.toml'
    )
    assert run(workspace, "--mode", "workspace-write", "--", plant) == 0
    assert "danger-full-access" in (workspace / "pyproject.toml").read_text()
    capsys.readouterr()

    code = run(workspace, "--", "echo x > escaped")
    err = capsys.readouterr().err
    assert code != 0  # still read-only
    assert not (workspace / "escaped").exists()
    assert not (workspace / "ran-unconfined").exists()
    notices = [line for line in err.splitlines() if "notice:" in line]
    assert notices == [
        f"bash-sandbox: notice: ignoring [tool.bash-sandbox] in {workspace / 'pyproject.toml'}: "
        "confined commands can write the workspace, so its settings are never trusted; put "
        f"them in {os.environ['XDG_CONFIG_HOME']}/bash-sandbox/config.toml or pass --config"
    ]


def test_the_notice_stays_off_stdout_under_json(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "pyproject.toml").write_text('[tool.bash-sandbox]\nmode = "workspace-write"\n')
    code = run(workspace, "--json", "--", "echo x > f")
    out, err = capsys.readouterr()
    assert json.loads(out)["sandbox"]["mode"] == "read-only"
    assert code != 0 and not (workspace / "f").exists()
    assert "notice: ignoring [tool.bash-sandbox]" in err


def test_a_pyproject_without_our_table_gets_no_notice(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert run(workspace, "--", "true") == 0
    assert capsys.readouterr().err == ""


def test_the_mode_subcommand_ignores_the_workspace_table_too(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "pyproject.toml").write_text('[tool.bash-sandbox]\nmode = "workspace-write"\n')
    session = tmp_path / "s.jsonl"
    assert main(["mode", "--session", str(session), "--workspace", str(workspace)]) == 0
    out, err = capsys.readouterr()
    assert out == "default (read-only)\n"
    assert "notice: ignoring" in err


def test_explicit_config_inside_the_workspace_is_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = workspace / "sandbox.toml"
    planted.write_text('mode = "workspace-write"\n')
    code = run(workspace, "--config", str(planted), "--", "touch ran")
    line = refusal(capsys)
    assert code == 2
    assert line == (
        f"bash-sandbox: untrusted config refused: {planted}: lies inside {workspace}, which "
        "confined commands can write; keep the config outside every writable root "
        f"(e.g. {os.environ['XDG_CONFIG_HOME']}/bash-sandbox/config.toml)"
    )
    assert not (workspace / "ran").exists()


def test_the_workspace_pyproject_named_explicitly_is_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "pyproject.toml").write_text('[tool.bash-sandbox]\nmode = "workspace-write"\n')
    code = run(workspace, "--config", str(workspace / "pyproject.toml"), "--", "touch ran")
    assert code == 2
    assert "lies inside" in refusal(capsys)
    assert not (workspace / "ran").exists()


def test_a_symlink_to_a_config_inside_the_workspace_is_refused_by_its_real_path(
    tmp_path: Path, config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "evil.toml").write_text('mode = "workspace-write"\n')
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").symlink_to(workspace / "evil.toml")
    code = run(workspace, "--", "touch ran")
    assert code == 2
    assert f"lies inside {workspace}" in refusal(capsys)
    assert not (workspace / "ran").exists()


def test_a_user_config_inside_a_writable_root_is_refused(
    tmp_path: Path, config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text('mode = "workspace-write"\n')
    # The user makes their config dir writable to commands: the next run must not trust it.
    code = run(workspace, "--writable-root", str(config_home), "--", "touch ran")
    assert code == 2
    assert f"lies inside {config_home}" in refusal(capsys)
    assert not (workspace / "ran").exists()


def test_a_config_naming_its_own_directory_as_writable_root_is_refused(
    tmp_path: Path, config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config_home / "bash-sandbox").mkdir()
    path = config_home / "bash-sandbox" / "config.toml"
    path.write_text(f'mode = "workspace-write"\nwritable_roots = ["{config_home}"]\n')
    assert run(workspace, "--", "touch ran") == 2
    assert "lies inside" in refusal(capsys)
    assert not (workspace / "ran").exists()


def _user_config(config_home: Path) -> Path:
    (config_home / "bash-sandbox").mkdir(exist_ok=True)
    path = config_home / "bash-sandbox" / "config.toml"
    path.write_text('mode = "workspace-write"\n')
    return path


def test_a_group_writable_config_is_refused(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _user_config(config_home)
    path.chmod(0o664)
    assert run(workspace, "--", "touch ran") == 2
    assert refusal(capsys).endswith(
        f"{path}: writable by group or others (mode 0664); run `chmod go-w {path}`"
    )
    assert not (workspace / "ran").exists()


def test_a_config_in_a_directory_others_can_write_is_refused(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _user_config(config_home)
    path.parent.chmod(0o777)
    assert run(workspace, "--", "touch ran") == 2
    assert f"its directory {path.parent} is writable by others" in refusal(capsys)
    assert not (workspace / "ran").exists()


def test_a_config_with_a_second_hard_link_is_refused(
    tmp_path: Path, config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _user_config(config_home)
    os.link(path, tmp_path / "other-name.toml")
    assert run(workspace, "--", "touch ran") == 2
    assert "has 2 hard links" in refusal(capsys)
    assert not (workspace / "ran").exists()


def test_a_fifo_as_config_is_refused_without_hanging(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config_home / "bash-sandbox").mkdir()
    os.mkfifo(config_home / "bash-sandbox" / "config.toml", 0o600)
    assert run(workspace, "--", "touch ran") == 2  # an open() that blocked would hang here
    assert "not a regular file" in refusal(capsys)


def test_a_config_owned_by_another_user_is_refused(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file away needs root")
    path = _user_config(config_home)
    os.chown(path, 54321, 54321)
    assert run(workspace, "--", "touch ran") == 2
    assert "owned by uid 54321, not by you (uid 0) or root" in refusal(capsys)
    assert not (workspace / "ran").exists()


def test_refusal_with_json_is_an_error_object_on_stdout(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = workspace / "sandbox.toml"
    planted.write_text(WIDENING)
    code = run(workspace, "--json", "--config", str(planted), "--", "touch ran")
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2
    assert error["code"] == "CONFIG_UNTRUSTED" and error["exit_code"] == 2
    assert not (workspace / "ran").exists()


def test_a_session_log_inside_the_workspace_is_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A workspace-write command could append a wider mode to it before the next run.
    session = workspace / ".session.jsonl"
    session.write_text('{"type": "bash/sandbox-mode", "mode": "danger-full-access"}\n')
    code = run(workspace, "--session", str(session), "--json", "--", "touch ran")
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and error["code"] == "SESSION_UNTRUSTED"
    assert not (workspace / "ran").exists()
