"""`bash-sandbox run` must not load the attack catalog: it only needs the audit's flags."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_cli_loads_no_attack_module_and_no_audit_runner() -> None:
    # A fresh interpreter: this test process has probably imported the catalog already.
    probe = (
        "import json, sys; import bash_sandbox.cli.main; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('bash_sandbox.audit'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(done.stdout)
    assert "bash_sandbox.audit.command" in loaded  # the parser's flags come from here
    forbidden = [
        m
        for m in loaded
        if m.startswith("bash_sandbox.audit.attacks")
        or m in ("bash_sandbox.audit.runner", "bash_sandbox.audit.drives")
    ]
    assert not forbidden, forbidden


def test_the_audit_package_still_exports_the_catalog_on_demand() -> None:
    import bash_sandbox.audit as audit

    assert len(audit.ATTACKS) > 100
    assert callable(audit.audit_main)
