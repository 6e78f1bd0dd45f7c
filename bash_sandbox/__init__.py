"""Confined execution: `SandboxBashExecutor` with bubblewrap, Landlock and Seatbelt backends.

The public names are loaded on first use (PEP 562), so `import bash_sandbox.cli` or any
other submodule pays only for what it imports itself.
"""

from __future__ import annotations

import importlib

# Not `typing.TYPE_CHECKING`: importing typing costs the warm CLI's client 4-5 ms, and this
# package is on its path (mypy reads any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from bash_sandbox.config import SandboxBashConfig
    from bash_sandbox.errors import SandboxUnavailableError
    from bash_sandbox.executor import SandboxBashExecutor

__all__ = ["SandboxBashConfig", "SandboxBashExecutor", "SandboxUnavailableError"]

_HOMES = {
    "SandboxBashConfig": "bash_sandbox.config",
    "SandboxBashExecutor": "bash_sandbox.executor",
    "SandboxUnavailableError": "bash_sandbox.errors",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted((*globals(), *__all__))
