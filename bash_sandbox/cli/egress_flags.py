"""`run --publish` and the `--pin` value grammar (the shared egress flags themselves are
declared with every other shared flag, in `settings.py`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from policies.egress import canonical_pins

if TYPE_CHECKING:
    from bash_local.output import OutputListener
    from bash_sandbox.executor import SandboxBashExecutor
    from bash_seam import BashExecSpec, BashRunResult


def pin_value(text: str) -> tuple[str, str]:
    """``NAME=ADDRESS`` for `--pin`, checked as the config's `pin` table checks it
    (ValueError otherwise)."""
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise ValueError(f"expected NAME=ADDRESS, got {text!r}")
    ((canonical, (value,)),) = canonical_pins({name.strip(): address.strip()}).items()
    return canonical, value


def port_arg(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {text!r}")
    return int(text)


def add_publish_flag(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--publish",
        action="append",
        default=[],
        type=port_arg,
        metavar="PORT",
        help="make the sandbox's 127.0.0.1:PORT reachable from this host's 127.0.0.1 while "
        "the command runs (on a free host port; the URL is printed on "
        "stderr); repeatable",
    )


async def run_published(
    executor: SandboxBashExecutor,
    spec: BashExecSpec,
    ports: Sequence[int],
    listener: OutputListener | None,
) -> BashRunResult:
    """`executor.run(spec)` with ``ports`` published for as long as it runs."""
    if not ports:
        return await executor.run(spec, on_output=listener)
    publication = await executor.publish(ports, spec)
    try:
        for port, url in publication.urls.items():
            sys.stderr.write(f"bash-sandbox: sandbox port {port} published at {url}\n")
        sys.stderr.flush()
        return await executor.run(spec, on_output=listener)
    finally:
        publication.close()
