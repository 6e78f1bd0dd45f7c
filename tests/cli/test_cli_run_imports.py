"""The run path imports only what a run needs: cold modules stay out of `sys.modules`.

Each test runs a real `bash-sandbox run` in a fresh interpreter and lists what it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import require_backend

# Prefixes no plain `run` may load: other subcommands, the egress proxy (only an allowlist
# needs it), macOS's backend, config parsing without a config file.
COLD = (
    "bash_sandbox_audit",
    "bash_sandbox.cli.doctor",
    "bash_sandbox.cli.mcp",
    "bash_sandbox.egress",
    "bash_sandbox.backends.seatbelt",
    "mcp",
    "h11",
    "tomllib",
    "difflib",
)

_RUN_AND_LIST = """
import json, sys
import bash_sandbox.cli.main
status = sys.modules["bash_sandbox.cli.main"].main(sys.argv[1:])
sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n")
raise SystemExit(status)
"""


def _run_listing_modules(tmp: Path, *args: str) -> tuple[int, list[str]]:
    env = dict(os.environ, TMPDIR=str(tmp), XDG_CONFIG_HOME=str(tmp / "no-config"))
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST, "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return done.returncode, json.loads(line.removeprefix("MODULES "))


def _cold(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
def test_a_run_loads_no_cold_module_and_really_runs(
    backend: str, workspace: Path, private_tempdir: Path
) -> None:
    require_backend(backend)
    status, modules = _run_listing_modules(
        private_tempdir,
        "--backend",
        backend,
        "--mode",
        "workspace-write",
        "--workspace",
        str(workspace),
        "--",
        "echo ran > marker",
    )
    assert status == 0
    assert (workspace / "marker").read_text() == "ran\n"  # the command did run, confined
    assert _cold(modules, COLD) == []
    if backend == "bwrap":
        assert _cold(modules, ("landlockpy",)) == []  # bindings of the other backend


def test_an_allowlist_does_load_the_egress_proxy(workspace: Path, private_tempdir: Path) -> None:
    # The control: the same listing sees the proxy when the policy needs it.
    require_backend("bwrap")
    status, modules = _run_listing_modules(
        private_tempdir,
        "--backend",
        "bwrap",
        "--allow-domain",
        "pkg.example.test",
        "--workspace",
        str(workspace),
        "--",
        "true",
    )
    assert status == 0
    assert "h11" in modules
    assert "bash_sandbox.egress.proxy" in modules


def test_the_deferred_subcommands_still_parse_and_explain_their_flags() -> None:
    from bash_sandbox.cli.arguments import build_parser

    parser = build_parser("0")
    audit = parser.parse_args(["audit", "--backend", "bwrap", "--attack", "row1-*"])
    assert (audit.backend, audit.attack) == ("bwrap", ["row1-*"])
    mcp = parser.parse_args(["mcp", "--mode", "workspace-write"])
    assert mcp.mode == "workspace-write"
    helps = {
        name: sub.format_help()
        for name, sub in parser._subparsers._group_actions[0].choices.items()  # type: ignore[union-attr]
    }
    assert "--attack GLOB" in helps["audit"]
    assert "--allow-escalation-to" in helps["mcp"]
    assert "client configuration" in helps["mcp"]  # its epilog comes with its flags
