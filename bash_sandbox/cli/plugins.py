"""Subcommands that live outside the runtime: the `bash_sandbox.commands` entry-point group.

The threat-model audit (`bash_sandbox_audit`) ships beside the runtime but is never imported
by it: `bash-sandbox audit` finds it through its entry point, only when that subcommand is
parsed. A subcommand module provides `add_arguments(parser)` and `main(args) -> int`.
"""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points
from types import ModuleType
from typing import Protocol, cast

GROUP = "bash_sandbox.commands"


class SubcommandModule(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


class SubcommandMissingError(LookupError):
    """No installed package provides the subcommand (an incomplete install)."""

    code = "SUBCOMMAND_MISSING"


def load_subcommand(name: str) -> SubcommandModule:
    """The module registered for ``name`` in the entry-point group."""
    for point in entry_points(group=GROUP, name=name):
        module = point.load()
        if isinstance(module, ModuleType):
            return cast(SubcommandModule, module)
    raise SubcommandMissingError(
        f"the {name!r} subcommand is not installed (reinstall bash-sandbox: its "
        f"{GROUP} entry point is missing)"
    )
