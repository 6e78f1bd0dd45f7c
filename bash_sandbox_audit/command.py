"""`bash-sandbox audit`: the CLI entry point (`audit_main`) and its arguments.

The CLI module wires `add_audit_arguments` and `audit_main` into its `audit` subcommand;
everything else (running, cleaning up, rendering) lives in the rest of this package and is
imported only when the audit runs, so building the CLI's parser never loads the catalog.
Exit status: 0 when nothing escaped and every control works, 1 otherwise, 2 for a usage
error, 130/143 when interrupted (after everything the audit started was removed).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING

from bash_sandbox_audit.model import CONFINED_MODES, LINUX_BACKENDS
from policies import SandboxMode

if TYPE_CHECKING:
    from bash_sandbox_audit.runner import AuditReport

EXIT_USAGE = 2


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """The `audit` subcommand's flags."""
    parser.add_argument(
        "--backend",
        choices=("all", *LINUX_BACKENDS),
        default="all",
        help="backend to attack (default: every Linux backend)",
    )
    parser.add_argument(
        "--mode",
        choices=("all", *(m.value for m in CONFINED_MODES)),
        default="all",
        help="confined mode to attack (default: both)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of the table"
    )
    parser.add_argument(
        "--attack",
        action="append",
        default=[],
        metavar="GLOB",
        help="only attacks whose id matches GLOB (repeatable), e.g. 'row11-*'",
    )


class _Terminated(Exception):
    """SIGTERM arrived; the audit was cancelled and has cleaned up."""


async def _audit(backends: list[str], modes: list[SandboxMode], globs: list[str]) -> AuditReport:
    from bash_sandbox_audit.runner import run_audit, select

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = False

    def on_term() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    # SIGTERM (e.g. a CI timeout) cancels like Ctrl-C does, so the cleanup still runs.
    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        return await run_audit(backends=backends, modes=modes, attacks=select(globs))
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def audit_main(args: argparse.Namespace) -> int:
    """Run the audit as `args` asks; print the table (or JSON); return the exit status."""
    backend = getattr(args, "backend", None) or "all"
    mode = getattr(args, "mode", None) or "all"
    globs: list[str] = list(getattr(args, "attack", None) or [])
    backends = list(LINUX_BACKENDS) if backend == "all" else [str(backend)]
    try:
        modes = list(CONFINED_MODES) if mode == "all" else [SandboxMode(str(mode))]
    except ValueError as exc:
        print(f"bash-sandbox audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if any(m not in CONFINED_MODES for m in modes):
        print(
            "bash-sandbox audit: only the confined modes (read-only, workspace-write) can "
            "be audited",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not sys.platform.startswith("linux"):
        print(
            "bash-sandbox audit: the Linux backends can only be audited on Linux", file=sys.stderr
        )
        return EXIT_USAGE
    # The catalog is imported only now: `bash-sandbox run` builds this parser too.
    from bash_sandbox_audit.report import render_json, render_table
    from bash_sandbox_audit.runner import select

    if not select(globs):
        print(f"bash-sandbox audit: no attack matches {globs}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = asyncio.run(_audit(backends, modes, globs))
    except (KeyboardInterrupt, asyncio.CancelledError, _Terminated) as exc:
        print("bash-sandbox audit: interrupted; everything it started was removed", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, _Terminated) else signal.SIGINT)
    sys.stdout.write(render_json(report) if getattr(args, "json", False) else render_table(report))
    return report.exit_code


# The `bash_sandbox.commands` entry point's interface (`bash_sandbox.cli.plugins`).
add_arguments = add_audit_arguments
main = audit_main
