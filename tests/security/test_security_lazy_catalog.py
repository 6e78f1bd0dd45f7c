"""`bash-sandbox run` must not load the attack catalog; `audit` loads it only when asked."""

from __future__ import annotations

import json
import subprocess
import sys

_LIST_AUDIT_MODULES = (
    "import json, sys; import bash_sandbox.cli.main; "
    "from bash_sandbox.cli.arguments import build_parser; {action}; "
    "print(json.dumps(sorted(n for n in sys.modules if n.startswith('bash_sandbox_audit'))))"
)


def _audit_modules_after(action: str) -> list[str]:
    # A fresh interpreter: this test process has probably imported the catalog already.
    done = subprocess.run(
        [sys.executable, "-c", _LIST_AUDIT_MODULES.format(action=action)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_importing_the_cli_loads_no_audit_module_at_all() -> None:
    assert _audit_modules_after("pass") == []


def test_parsing_audit_flags_loads_the_flags_but_no_attack_module_and_no_runner() -> None:
    loaded = _audit_modules_after("build_parser('0').parse_args(['audit', '--json'])")
    assert "bash_sandbox_audit.command" in loaded  # the audit's flags come from here
    forbidden = [
        n
        for n in loaded
        if n.startswith("bash_sandbox_audit.attacks")
        or n in ("bash_sandbox_audit.runner", "bash_sandbox_audit.drives")
    ]
    assert not forbidden, forbidden


def test_the_audit_package_still_exports_the_catalog_on_demand() -> None:
    import bash_sandbox_audit as audit

    assert len(audit.ATTACKS) > 100
    assert callable(audit.audit_main)


def test_no_runtime_module_imports_the_audit_package() -> None:
    # The audit is its own package: the runtime finds it only through its entry point.
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for package in ("policies", "bash_seam", "bash_local", "bash_sandbox"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                offenders += [f"{path}: {n}" for n in names if n.startswith("bash_sandbox_audit")]
    assert offenders == []


def test_the_audit_subcommand_is_found_through_its_entry_point() -> None:
    from bash_sandbox.cli.plugins import load_subcommand

    module = load_subcommand("audit")
    assert module.__name__ == "bash_sandbox_audit.command"  # type: ignore[attr-defined]
