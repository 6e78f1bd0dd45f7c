"""The egress flags of `run` and `mcp`: pins, private-range names, the hosts file.

The end-to-end run pins `registry.test` in a temp hosts file (never the host's) to the
host's 127.0.0.1, where a real upstream listens, and checks the upstream's log.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_probes import CliRunner

from bash_sandbox.cli.arguments import UsageError, build_parser
from bash_sandbox.cli.config_file import ConfigError
from bash_sandbox.cli.main import run_config
from tests.egress.servers import UpstreamServer


def test_run_flags_reach_the_config(workspace: Path, config_home: Path) -> None:
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text(
        'allow_private_domains = ["*.corp.example"]\n'
        'pin = {"a.example" = "10.0.0.1", "b.example" = ["10.0.0.2", "fd00::2"]}\n'
    )
    args = build_parser("test").parse_args(
        [
            "run",
            "--allow-private-domain",
            "Mirror.Example",
            "--pin",
            "c.example=127.0.0.1",
            "--pin",
            "a.example=10.0.0.9",
            "--hosts-file",
            "/nonexistent/hosts",
            "--",
            "true",
        ]
    )
    config, _ = run_config(args, str(workspace))
    assert config.allow_private_domains == ("*.corp.example", "mirror.example")
    assert config.pin == {
        "a.example": ("10.0.0.9",),  # the flag replaces the file's answer for that name
        "b.example": ("10.0.0.2", "fd00::2"),
        "c.example": ("127.0.0.1",),
    }
    assert config.hosts_file == "/nonexistent/hosts"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--pin", "no-equals"], "NAME=ADDRESS"),
        (["--pin", "a.example=not-an-address"], "not an IP address"),
        (["--pin", "10.0.0.1=10.0.0.2"], "pin a host name"),
    ],
)
def test_bad_pins_are_usage_errors(flags: list[str], said: str) -> None:
    with pytest.raises(UsageError, match=said):
        build_parser("test").parse_args(["run", *flags, "--", "true"])


def test_an_address_is_not_a_private_domain(workspace: Path) -> None:
    args = build_parser("test").parse_args(
        ["run", "--allow-private-domain", "10.0.0.0", "--", "true"]
    )
    with pytest.raises(ConfigError, match=r"allow_private_domains entry '10\.0\.0\.0'"):
        run_config(args, str(workspace))


def test_mcp_takes_the_same_egress_flags(workspace: Path) -> None:
    pytest.importorskip("mcp")
    from bash_sandbox.cli.mcp_server import build_settings

    args = build_parser("test").parse_args(
        [
            "mcp",
            "--workspace",
            str(workspace),
            "--allow-domain",
            "registry.test",
            "--allow-private-domain",
            "registry.test",
            "--pin",
            "registry.test=127.0.0.1",
        ]
    )
    config = build_settings(args).config
    assert config.allow_domains == ("registry.test",)
    assert config.allow_private_domains == ("registry.test",)
    assert config.pin == {"registry.test": ("127.0.0.1",)}


def test_run_reaches_a_name_pinned_in_the_hosts_file(
    cli: CliRunner, workspace: Path, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 registry.test\n")
    site_root = tmp_path / "site"
    site_root.mkdir()
    (site_root / "simple.txt").write_text("from the mirror\n")
    with UpstreamServer(site_root) as site:
        url = site.url("registry.test", "/simple.txt")
        done = cli.run(
            "run",
            "--json",
            "--workspace",
            str(workspace),
            "--allow-domain",
            "registry.test",
            "--hosts-file",
            str(hosts),
            "--",
            shlex.join(["curl", "-sS", "--max-time", "20", url]),
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["stdout"]["text"] == "from the mirror\n"
        assert any("pinned by " + str(hosts) in w for w in result["sandbox"]["warnings"])
        assert [r.path for r in site.requests] == ["/simple.txt"]


def test_run_publish_serves_the_sandboxed_server_to_the_host_while_it_runs(
    cli: CliRunner, workspace: Path
) -> None:
    import re
    import signal
    import socket
    import sys
    import urllib.request

    from cli_probes import read_until

    (workspace / "index.html").write_text("published page\n")
    server = shlex.join([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "3000"])
    proc = cli.start(
        "run", "--workspace", str(workspace), "--publish", "3000", "--", f"exec {server}"
    )
    assert proc.stderr is not None and proc.stdout is not None
    seen = bytearray()
    read_until(proc.stderr.fileno(), b"\n", seen)
    match = re.search(rb"sandbox port 3000 published at (http://127\.0\.0\.1:(\d+))", seen)
    assert match is not None, bytes(seen)
    url, host_port = match.group(1).decode(), int(match.group(2))
    read_until(proc.stdout.fileno(), b"Serving HTTP", bytearray())
    with urllib.request.urlopen(url + "/index.html", timeout=10) as response:
        assert response.read() == b"published page\n"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", host_port), timeout=2).close()


def test_credentials_come_from_the_config_file(workspace: Path, config_home: Path) -> None:
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text(
        'allow_domains = ["api.example"]\n'
        '[[credentials]]\ndomain = "API.example"\nsource = "env:API_SECRET"\nenv = "API_TOKEN"\n'
    )
    args = build_parser("test").parse_args(["run", "--", "true"])
    config, _ = run_config(args, str(workspace))
    (credential,) = config.credentials
    assert (credential.domain, credential.source, credential.env) == (
        "api.example",
        "env:API_SECRET",
        "API_TOKEN",
    )


def test_a_bad_credential_is_a_config_error_naming_it(workspace: Path, config_home: Path) -> None:
    (config_home / "bash-sandbox").mkdir()
    (config_home / "bash-sandbox" / "config.toml").write_text(
        '[[credentials]]\ndomain = "api.example"\nsource = "somewhere"\n'
    )
    args = build_parser("test").parse_args(["run", "--", "true"])
    with pytest.raises(ConfigError, match=r"credentials\[0\]\.source"):
        run_config(args, str(workspace))


def test_pip_downloads_through_the_cli_from_a_pinned_registry(
    cli: CliRunner, workspace: Path, tmp_path: Path
) -> None:
    import sys

    from tests.egress.servers import make_simple_index

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 registry.test\n")
    root = tmp_path / "index"
    wheel = make_simple_index(root)
    with UpstreamServer(root) as index:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "-d", "dest"]
        argv += ["--disable-pip-version-check", "--index-url"]
        argv += [index.url("registry.test", "/simple/"), "--trusted-host", "registry.test"]
        argv += ["egress-probe"]
        done = cli.run(
            "run",
            "--json",
            "--mode",
            "workspace-write",
            "--workspace",
            str(workspace),
            "--allow-domain",
            "registry.test",
            "--hosts-file",
            str(hosts),
            "--",
            "PIP_CONFIG_FILE=/dev/null " + shlex.join(argv),
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "/simple/egress-probe/" in [r.path for r in index.requests]
    assert (workspace / "dest" / wheel).is_file()
    result = json.loads(done.stdout)
    assert any("registry.test reached at 127.0.0.1" in w for w in result["sandbox"]["warnings"])


def test_an_empty_hosts_file_reads_none_and_a_relative_one_is_made_absolute(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse = build_parser("test").parse_args
    config, _ = run_config(parse(["run", "--hosts-file", "", "--", "true"]), str(workspace))
    assert config.hosts_file is None
    monkeypatch.chdir(workspace.parent)
    config, _ = run_config(parse(["run", "--hosts-file", "h", "--", "true"]), str(workspace))
    assert config.hosts_file == str(workspace.parent / "h")
