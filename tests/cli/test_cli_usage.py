"""The command line itself: --version, --help, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_probes import CliRunner

from bash_sandbox.cli.main import main, package_version


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"bash-sandbox {package_version()}\n"
    assert package_version() != "unknown"


@pytest.mark.parametrize(
    "argv", [[], ["run", "--help"], ["mode", "--help"], ["doctor", "--help"], ["--help"]]
)
def test_help_has_examples(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    if argv:
        assert code == 0
        assert "examples:" in out
    else:
        assert code == 2  # a subcommand is required
        assert "usage: bash-sandbox" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["run", "--timeout-ms", "0", "--", "true"],
        ["run", "--timeout-ms", "soon", "--", "true"],
        ["run", "--network", "internet", "--", "true"],
        ["run", "--backend", "docker", "--", "true"],
        ["doctor", "--bogus"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_module_entry_point_exits_with_the_status(cli: CliRunner, workspace: Path) -> None:
    assert cli.run("--version").stdout.startswith(b"bash-sandbox ")
    assert cli.run("run", "--timeout-ms", "0", "--", "true").returncode == 2


def test_options_meant_for_the_command_need_the_double_dash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "ls", "-la"]) == 2
    assert "unrecognized arguments: -la (put the command after `--`" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--json", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
        (["run", "--json", "--timeout-ms", "soon", "--", "true"], "argument --timeout-ms"),
        (["run", "--json", "--memory", "lots", "--", "true"], "argument --memory"),
        (["run", "--json"], "run: no command given"),
        (["run", "--js", "--mode", "bogus", "--", "true"], "unknown sandbox mode 'bogus'"),
    ],
)
def test_json_usage_errors_are_an_error_object_on_stdout(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    error = json.loads(out)["error"]
    assert error["code"] == "USAGE" and error["exit_code"] == 2
    assert message in error["message"]
    assert message in err  # the human-readable line stays on stderr


def test_a_json_flag_after_the_double_dash_belongs_to_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--bogus", "--", "echo", "--json"]) == 2
    assert capsys.readouterr().out == ""


def test_mcp_without_the_sdk_extra_says_how_to_install_it() -> None:
    import subprocess
    import sys

    # `sys.modules["mcp"] = None` makes `import mcp` fail as on an install without the extra.
    code = (
        "import sys; sys.modules['mcp'] = None; "
        "from bash_sandbox.cli.main import main; raise SystemExit(main(['mcp']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "pip install 'bash-sandbox[mcp]'" in done.stderr
    assert done.stdout == ""
