"""Suite-wide switches. ``BASH_SANDBOX_TEST_SPAWN_HELPER=1`` runs every confined executor
the tests make with the spawn helper on (`SandboxBashConfig.spawn_helper`), so any suite can
be run on the helper path as it is."""

from __future__ import annotations

import os

if os.environ.get("BASH_SANDBOX_TEST_SPAWN_HELPER") == "1":
    from bash_sandbox.config import SandboxBashConfig

    SandboxBashConfig.model_fields["spawn_helper"].default = True
    SandboxBashConfig.model_rebuild(force=True)
