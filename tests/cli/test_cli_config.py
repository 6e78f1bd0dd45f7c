"""Configuration files: `[tool.bash-sandbox]` in the workspace's pyproject.toml or `--config`.

A bad file is exactly one `bash-sandbox: config error:` line naming the key, and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP, HAS_LANDLOCK

from bash_sandbox.cli import main
from bash_sandbox.cli.config_file import ConfigError, build_config, load_config
from policies import NetworkMode, SandboxMode

needs_sandbox = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")


def write_pyproject(workspace: Path, body: str) -> Path:
    path = workspace / "pyproject.toml"
    path.write_text("[project]\nname = 'demo'\n\n[tool.bash-sandbox]\n" + body)
    return path


def config_error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("bash-sandbox: config error: ")
    return lines[0]


def test_bad_value_is_one_line_naming_the_key_and_the_file(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pyproject(workspace, "timeout_ms = 0\n")
    code = main(["run", "--workspace", str(workspace), "--", "true"])
    line = config_error(capsys)
    assert code == 2
    assert line == (
        f"bash-sandbox: config error: timeout_ms: Input should be greater than 0 "
        f"(in {path} [tool.bash-sandbox])"
    )


def test_unknown_key_is_rejected_by_name(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pyproject(workspace, "colour = 'blue'\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "colour: unknown key (known keys: backend, cwd, " in config_error(capsys)


def test_misspelt_key_gets_a_suggestion(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pyproject(workspace, "timout-ms = 5\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "timout-ms: unknown key (did you mean timeout_ms?)" in config_error(capsys)


def test_dashed_keys_are_accepted_and_errors_quote_them_as_written(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pyproject(workspace, "max-output-bytes = -1\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "config error: max-output-bytes: Input should be greater than 0" in config_error(capsys)


def test_unknown_mode_value_names_the_valid_modes(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pyproject(workspace, "mode = 'write-everything'\n")
    assert (
        main(["mode", "--session", str(workspace / "s.jsonl"), "--workspace", str(workspace)]) == 2
    )
    line = config_error(capsys)
    assert "mode: Input should be 'read-only', 'workspace-write' or 'danger-full-access'" in line


def test_invalid_toml_is_a_config_error(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "pyproject.toml").write_text("[tool.bash-sandbox\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "not valid TOML" in config_error(capsys)


def test_relative_writable_root_is_a_config_error(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pyproject(workspace, "writable_roots = ['build']\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    line = config_error(capsys)
    assert "writable_roots" in line and "absolute" in line and "pyproject.toml" in line


def test_a_bad_file_value_is_reported_even_when_a_flag_overrides_it(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pyproject(workspace, "timeout_ms = 0\n")
    assert main(["run", "--workspace", str(workspace), "--timeout-ms", "100", "--", "true"]) == 2
    assert "timeout_ms" in config_error(capsys)


def test_missing_config_file_is_a_config_error(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    assert main(["--config", str(missing), "run", "--workspace", str(workspace), "--", "true"]) == 2
    assert config_error(capsys).endswith(f"file not found (in {missing})")


@needs_sandbox
def test_pyproject_mode_is_the_default(workspace: Path) -> None:
    write_pyproject(workspace, 'mode = "workspace-write"\n')
    assert main(["run", "--workspace", str(workspace), "--", "echo x > f"]) == 0
    assert (workspace / "f").exists()


@needs_sandbox
def test_pyproject_in_the_current_directory_is_used(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pyproject(workspace, 'mode = "workspace-write"\n')
    monkeypatch.chdir(workspace)
    assert main(["run", "--", "echo x > f"]) == 0
    assert (workspace / "f").exists()


@needs_sandbox
def test_flags_override_file_values(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pyproject(workspace, 'mode = "workspace-write"\nnetwork = "host"\n')
    code = main(
        [
            "run",
            "--workspace",
            str(workspace),
            "--mode",
            "read-only",
            "--network",
            "isolated",
            "--json",
            "--",
            "echo x > f",
        ]
    )
    sandbox = json.loads(capsys.readouterr().out)["sandbox"]
    assert code != 0
    assert sandbox["mode"] == "read-only" and sandbox["network"] == "isolated"
    assert not (workspace / "f").exists()


@needs_sandbox
def test_explicit_config_file_uses_top_level_keys_before_or_after_the_subcommand(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text('mode = "workspace-write"\ntimeout-ms = 4321\n')
    for argv in (["--config", str(config), "run"], ["run", "--config", str(config)]):
        code = main([*argv, "--workspace", str(workspace), "--json", "--", "echo x > f"])
        data = json.loads(capsys.readouterr().out)
        assert code == 0
        assert data["timeout_ms"] == 4321 and data["sandbox"]["mode"] == "workspace-write"


@needs_sandbox
def test_pyproject_without_our_table_is_ignored(workspace: Path) -> None:
    (workspace / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 0


# -- the loader, directly ---------------------------------------------------------------------


def test_loader_normalises_dashes_and_validates(workspace: Path) -> None:
    write_pyproject(workspace, 'probe-timeout-ms = 100\nnetwork = "host"\n')
    loaded = load_config(None, str(workspace))
    config = build_config(loaded, {"mode": SandboxMode.WORKSPACE_WRITE})
    assert config.probe_timeout_ms == 100
    assert config.network is NetworkMode.HOST
    assert config.mode is SandboxMode.WORKSPACE_WRITE


def test_loader_rejects_a_key_given_twice(workspace: Path) -> None:
    write_pyproject(workspace, "timeout-ms = 1\ntimeout_ms = 2\n")
    with pytest.raises(ConfigError, match="given twice"):
        load_config(None, str(workspace))


def test_loader_rejects_a_non_table_section(workspace: Path) -> None:
    (workspace / "pyproject.toml").write_text("[tool]\nbash-sandbox = 3\n")
    with pytest.raises(ConfigError, match=r"\[tool.bash-sandbox\] must be a table"):
        load_config(None, str(workspace))


def test_no_file_means_the_defaults(workspace: Path) -> None:
    loaded = load_config(None, str(workspace))
    assert loaded.source is None
    assert build_config(loaded, {}).mode is SandboxMode.READ_ONLY
