"""`run`'s policy flags: writable roots, denied reads, protected names, domains and limits.

Path flags are checked by what the command could do on the host (file present or absent,
secret printed or not); the limit and domain flags by the config they produce, since
enforcing them is the executor's job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP, HAS_LANDLOCK

from bash_sandbox.cli import main
from bash_sandbox.cli.arguments import build_parser, size_bytes
from bash_sandbox.cli.main import run_config

needs_sandbox = pytest.mark.skipif(not (HAS_BWRAP or HAS_LANDLOCK), reason="no sandbox backend")


def run(workspace: Path, *args: str) -> int:
    return main(["run", "--workspace", str(workspace), *args])


@needs_sandbox
def test_writable_root_flag_adds_a_directory_to_workspace_write(
    tmp_path: Path, workspace: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    write = f"echo built > {cache}/out"
    assert run(workspace, "--mode", "workspace-write", "--", write) != 0
    assert not (cache / "out").exists()
    assert (
        run(workspace, "--mode", "workspace-write", "--writable-root", str(cache), "--", write) == 0
    )
    assert (cache / "out").read_text() == "built\n"


@needs_sandbox
def test_writable_roots_accept_home_relative_paths(
    tmp_path: Path, workspace: Path, config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "flag").mkdir(parents=True)
    (home / "file").mkdir()
    monkeypatch.setenv("HOME", str(home))
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text("writable_roots = ['~/file']\n")
    code = run(
        workspace,
        "--mode",
        "workspace-write",
        "--writable-root",
        "~/flag",
        "--",
        f"touch {home}/flag/a {home}/file/b",
    )
    assert code == 0
    assert (home / "flag" / "a").exists() and (home / "file" / "b").exists()


def test_a_missing_writable_root_flag_is_a_config_error_and_nothing_runs(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir"
    code = run(
        workspace, "--mode", "workspace-write", "--writable-root", str(missing), "--", "touch ran"
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"bash-sandbox: config error: writable_roots: {str(missing)!r} is not an existing "
        "directory (from the command line)\n"
    )
    assert not (workspace / "ran").exists()


def test_a_missing_writable_root_in_the_file_names_its_key(
    tmp_path: Path, workspace: Path, config_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config_home / "bash-sandbox").mkdir()
    path = config_home / "bash-sandbox" / "config.toml"
    path.write_text(f"writable-roots = ['{tmp_path}', '{tmp_path}/gone']\n")
    code = run(workspace, "--json", "--", "true")
    out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        f"bash-sandbox: config error: writable-roots[1]: '{tmp_path}/gone' is not an existing "
        f"directory (in {path})\n"
    )
    assert json.loads(out)["error"]["code"] == "CONFIG_INVALID"


@needs_sandbox
def test_deny_read_flag_hides_a_file_and_keeps_the_defaults(
    tmp_path: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("default-secret\n")
    secret = tmp_path / "token.txt"
    secret.write_text("flag-secret\n")
    monkeypatch.setenv("HOME", str(home))
    code = run(
        workspace,
        "--deny-read",
        str(secret),
        "--",
        f"cat {secret}; cat {home}/.ssh/id_ed25519; echo done",
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out == "done\n"  # neither secret reached the command
    assert secret.read_text() == "flag-secret\n"


@needs_sandbox
def test_protected_path_flag_keeps_a_name_read_only_in_workspace_write(
    workspace: Path,
) -> None:
    (workspace / ".env").write_text("API_KEY=original\n")
    code = run(
        workspace,
        "--mode",
        "workspace-write",
        "--protected-path",
        ".env",
        "--",
        "echo API_KEY=stolen > .env; echo other > other.txt",
    )
    assert code == 0  # the last command's status; the .env write failed before it
    assert (workspace / ".env").read_text() == "API_KEY=original\n"
    assert (workspace / "other.txt").read_text() == "other\n"


def test_limit_and_domain_flags_become_the_config(workspace: Path) -> None:
    args = build_parser("test").parse_args(
        [
            "run",
            "--memory",
            "2G",
            "--max-processes",
            "64",
            "--cpus",
            "1.5",
            "--tmp-size",
            "512M",
            "--shm-size",
            "64m",
            "--max-open-files",
            "256",
            "--allow-domain",
            "pypi.org",
            "--allow-domain",
            "*.npmjs.org",
            "--",
            "true",
        ]
    )
    config, _ = run_config(args, str(workspace))
    limits = config.limits
    assert limits.memory_bytes == 2 << 30
    assert limits.processes == 64
    assert limits.cpu_cores == 1.5
    assert limits.tmp_bytes == 512 << 20
    assert limits.shm_bytes == 64 << 20
    assert limits.open_files == 256
    assert config.allow_domains == ("pypi.org", "*.npmjs.org")


def test_limit_flags_replace_single_limits_of_the_file(workspace: Path, config_home: Path) -> None:
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text(
        "[limits]\nprocesses = 100\nopen_files = 1000\n"
    )
    args = build_parser("test").parse_args(["run", "--max-open-files", "500", "--", "true"])
    config, _ = run_config(args, str(workspace))
    assert config.limits.processes == 100
    assert config.limits.open_files == 500


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("8K", 8192),
        ("1m", 1 << 20),
        ("2G", 2 << 30),
        ("3GiB", 3 << 30),
        ("5MB", 5 << 20),
    ],
)
def test_sizes_take_binary_suffixes(text: str, expected: int) -> None:
    assert size_bytes(text) == expected


@pytest.mark.parametrize("bad", ["0", "-1G", "1.5G", "G", "12X", ""])
def test_a_bad_size_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", f"--memory={bad}", "--", "true"]) == 2
    assert "expected a size such as 512M or 2G" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--cpus", "--max-processes", "--max-open-files"])
def test_bad_numbers_are_usage_errors(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", flag, "0", "--", "true"]) == 2
    assert "expected a positive" in capsys.readouterr().err


# -- the working directory ---------------------------------------------------------------------


def test_an_unusable_workdir_is_exit_2(
    workspace: Path, config_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text("cwd = '/nonexistent-dir'\n")
    code = main(["run", "--json", "--", "true"])
    assert code == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "WORKDIR_UNUSABLE"


@needs_sandbox
def test_a_workdir_outside_every_root_is_exit_2(
    tmp_path: Path,
    workspace: Path,
    config_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text(
        f"workspace_root = '{workspace}'\ncwd = '{outside}'\nmode = 'workspace-write'\n"
    )
    monkeypatch.chdir(workspace)
    code = main(["run", "--json", "--", "touch ran-outside"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2, out
    assert out["error"]["code"] == "WORKDIR_UNUSABLE"
    assert not (outside / "ran-outside").exists()
