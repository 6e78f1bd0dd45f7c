"""Suite-wide switches. ``BASH_SANDBOX_TEST_SPAWN_HELPER=0`` runs every confined executor
the tests make with the spawn helper off (`SandboxBashConfig.spawn_helper`: each command
started from the executor's own process), ``=1`` with it on (the default), so any suite can
be run on either path as it is. ``BASH_SANDBOX_TEST_COMPILED_CHILD=0`` has every command's
child run its steps in Python (forked by the helper, or by `Popen` without it) even where
the compiled child is built (`linux/compiled_child.py`)."""

from __future__ import annotations

import os

_HELPER = os.environ.get("BASH_SANDBOX_TEST_SPAWN_HELPER")
if _HELPER in ("0", "1"):
    from bash_sandbox.config import SandboxBashConfig

    SandboxBashConfig.model_fields["spawn_helper"].default = _HELPER == "1"
    SandboxBashConfig.model_rebuild(force=True)

if os.environ.get("BASH_SANDBOX_TEST_COMPILED_CHILD") == "0":
    from bash_sandbox.linux import compiled_child

    compiled_child.ENABLED = False
