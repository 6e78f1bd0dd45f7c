"""Configuration files: the user config or `--config`, validated; flags win over them.

A bad file is exactly one `bash-sandbox: config error:` line naming the key, and exit 2.
The workspace's pyproject.toml is never configuration (see test_cli_config_trust.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP, HAS_LANDLOCK, children, write_user_config

from bash_sandbox.cli import main
from bash_sandbox.cli.config_file import (
    ConfigError,
    build_config,
    load_config,
    user_config_path,
)
from policies import NetworkMode, SandboxMode, default_deny_read

needs_sandbox = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")


def config_error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("bash-sandbox: config error: ")
    return lines[0]


def test_user_config_path_follows_xdg_and_defaults_to_dot_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert user_config_path() == str(tmp_path / "xdg" / "bash-sandbox" / "config.toml")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in ("", "relative/dir"):  # the XDG spec: empty or relative means the default
        monkeypatch.setenv("XDG_CONFIG_HOME", unset)
        assert user_config_path() == str(
            tmp_path / "home" / ".config" / "bash-sandbox" / "config.toml"
        )


def test_bad_value_is_one_line_naming_the_key_and_the_file(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_user_config(config_home, "timeout_ms = 0\n")
    code = main(["run", "--workspace", str(workspace), "--", "true"])
    line = config_error(capsys)
    assert code == 2
    assert (
        line
        == f"bash-sandbox: config error: timeout_ms: Input should be greater than 0 (in {path})"
    )


def test_unknown_key_is_rejected_by_name(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "colour = 'blue'\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    line = config_error(capsys)
    assert "colour: unknown key (known keys: allow_domains, " in line
    assert ", writable_roots)" in line


def test_misspelt_key_gets_a_suggestion(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "timout-ms = 5\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "timout-ms: unknown key (did you mean timeout_ms?)" in config_error(capsys)


def test_dashed_keys_are_accepted_and_errors_quote_them_as_written(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "max-output-bytes = -1\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "config error: max-output-bytes: Input should be greater than 0" in config_error(capsys)


def test_unknown_mode_value_names_the_valid_modes(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "mode = 'write-everything'\n")
    assert (
        main(["mode", "--session", str(workspace / "s.jsonl"), "--workspace", str(workspace)]) == 2
    )
    line = config_error(capsys)
    assert "mode: Input should be 'read-only', 'workspace-write' or 'danger-full-access'" in line


def test_invalid_toml_is_a_config_error(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "mode = \n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "not valid TOML" in config_error(capsys)


def test_relative_writable_root_is_a_config_error(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_user_config(config_home, "writable-roots = ['build']\n")
    assert main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert config_error(capsys) == (
        "bash-sandbox: config error: writable-roots[0]: must be an absolute path or ~/..., "
        f"got 'build' (in {path})"
    )


def test_a_bad_file_value_is_reported_even_when_a_flag_overrides_it(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "timeout_ms = 0\n")
    assert main(["run", "--workspace", str(workspace), "--timeout-ms", "100", "--", "true"]) == 2
    assert "timeout_ms" in config_error(capsys)


def test_missing_config_file_is_a_config_error(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    assert main(["--config", str(missing), "run", "--workspace", str(workspace), "--", "true"]) == 2
    assert config_error(capsys).endswith(f"file not found (in {missing})")


@needs_sandbox
def test_user_config_mode_is_the_default(config_home: Path, workspace: Path) -> None:
    write_user_config(config_home, 'mode = "workspace-write"\n')
    assert main(["run", "--workspace", str(workspace), "--", "echo x > f"]) == 0
    assert (workspace / "f").read_text() == "x\n"


@needs_sandbox
def test_flags_override_file_values(
    config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, 'mode = "workspace-write"\nnetwork = "host"\n')
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
def test_explicit_config_file_wins_over_the_user_config_before_or_after_the_subcommand(
    tmp_path: Path, config_home: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_config(config_home, "timeout-ms = 1111\n")
    config = tmp_path / "sandbox.toml"
    config.write_text('mode = "workspace-write"\ntimeout-ms = 4321\n')
    for argv in (["--config", str(config), "run"], ["run", "--config", str(config)]):
        code = main([*argv, "--workspace", str(workspace), "--json", "--", "echo x > f"])
        data = json.loads(capsys.readouterr().out)
        assert code == 0
        assert data["timeout_ms"] == 4321 and data["sandbox"]["mode"] == "workspace-write"
        assert (workspace / "f").exists()


@needs_sandbox
def test_explicit_pyproject_outside_the_workspace_is_read_from_its_tool_table(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "settings"
    elsewhere.mkdir()
    (elsewhere / "pyproject.toml").write_text("[tool.bash-sandbox]\ntimeout-ms = 2345\n")
    code = main(
        [
            "--config",
            str(elsewhere / "pyproject.toml"),
            "run",
            "--workspace",
            str(workspace),
            "--json",
            "--",
            "true",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["timeout_ms"] == 2345


# -- the loader, directly ---------------------------------------------------------------------


def test_loader_normalises_dashes_and_validates(config_home: Path, workspace: Path) -> None:
    write_user_config(config_home, 'probe-timeout-ms = 100\nnetwork = "host"\n')
    loaded = load_config(None, str(workspace))
    config = build_config(loaded, {"mode": SandboxMode.WORKSPACE_WRITE})
    assert config.probe_timeout_ms == 100
    assert config.network is NetworkMode.HOST
    assert config.mode is SandboxMode.WORKSPACE_WRITE


def test_loader_rejects_a_key_given_twice(config_home: Path, workspace: Path) -> None:
    write_user_config(config_home, "timeout-ms = 1\ntimeout_ms = 2\n")
    with pytest.raises(ConfigError, match="given twice"):
        load_config(None, str(workspace))


def test_loader_rejects_a_non_table_section(tmp_path: Path, workspace: Path) -> None:
    settings = tmp_path / "settings"
    settings.mkdir()
    (settings / "pyproject.toml").write_text("[tool]\nbash-sandbox = 3\n")
    with pytest.raises(ConfigError, match=r"\[tool.bash-sandbox\] must be a table"):
        load_config(str(settings / "pyproject.toml"), str(workspace))


def test_no_file_means_the_defaults(workspace: Path) -> None:
    loaded = load_config(None, str(workspace))
    assert loaded.source is None
    assert build_config(loaded, {}).mode is SandboxMode.READ_ONLY


def test_list_additions_extend_the_file_and_the_default_credential_stores(
    tmp_path: Path, config_home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    (tmp_path / "extra").mkdir()
    monkeypatch.setenv("HOME", str(home))
    write_user_config(config_home, "writable_roots = ['~/cache']\nprotected_paths = ['.env']\n")
    config = build_config(
        load_config(None, str(workspace)),
        {"limits": {"memory_bytes": 1 << 30}},
        additions={
            "writable_roots": [str(tmp_path / "extra")],
            "deny_read": ["/srv/secret"],
            "protected_paths": [".npmrc"],
            "allow_domains": ["pypi.org"],
        },
    )
    assert config.writable_roots == (str(home / "cache"), str(tmp_path / "extra"))
    assert config.protected_paths == (".env", ".npmrc")
    # Adding one denied path never un-denies the credential stores.
    assert config.deny_read == (*default_deny_read(), "/srv/secret")  # HOME is the home
    assert config.allow_domains == ("pypi.org",)
    # A limit flag replaces that limit only.
    assert config.limits.memory_bytes == 1 << 30
    assert config.limits.processes == 4096


def _children_cmdlines(pid: int) -> list[str]:
    out = []
    for child in children(pid):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"))
    return out


@needs_sandbox
@pytest.mark.parametrize("in_file", [None, "true", "false"])
def test_a_one_shot_run_forks_itself_unless_the_config_asks_for_the_helper(
    in_file: str | None, workspace: Path, config_home: Path, private_tempdir: Path
) -> None:
    """One command per CLI process: the spawn helper's start costs more than the one fork it
    saves, so `run` spawns from itself; a config file's `spawn_helper` still decides. Seen
    from outside: whether the CLI process has a helper child while the command runs."""
    if in_file is not None:
        write_user_config(config_home, f"spawn_helper = {in_file}\n")
    cli = [sys.executable, "-m", "bash_sandbox.cli", "run", "--workspace", str(workspace)]
    proc = subprocess.Popen(
        [*cli, "--", "echo started; sleep 30"],
        stdout=subprocess.PIPE,
        env=dict(os.environ, TMPDIR=str(private_tempdir), XDG_CONFIG_HOME=str(config_home)),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        helpers = [c for c in _children_cmdlines(proc.pid) if "spawn_helper.py" in c]
        assert len(helpers) == (1 if in_file == "true" else 0), _children_cmdlines(proc.pid)
    finally:
        proc.terminate()  # the CLI ends its command and its helper, as on a Ctrl-C
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
