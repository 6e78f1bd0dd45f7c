"""The network flags shared by `run` and `mcp`: private-range names, pinned answers, the
hosts file, and (for `mcp`, which had none) the allowlist itself; `run --publish`.

Kept in one module so the two commands spell them alike; `egress_settings()` turns the
parsed flags into the config overrides (``pin``, ``hosts_file``) and list additions
(``allow_private_domains``, and ``allow_domains`` for `mcp`) that `build_config` applies.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from policies.egress import canonical_pins

if TYPE_CHECKING:
    from bash_local.output import OutputListener
    from bash_sandbox.executor import SandboxBashExecutor
    from bash_seam import BashExecSpec, BashRunResult


def pin_arg(text: str) -> tuple[str, str]:
    """``NAME=ADDRESS`` for `--pin`, checked as the config's `pin` table checks it."""
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise argparse.ArgumentTypeError(f"expected NAME=ADDRESS, got {text!r}")
    try:
        ((canonical, (value,)),) = canonical_pins({name.strip(): address.strip()}).items()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
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


def add_egress_flags(parser: argparse._ActionsContainer, *, allow_domain: bool) -> None:
    """The egress flags; ``allow_domain``: add `--allow-domain` too (`run` has its own)."""
    if allow_domain:
        parser.add_argument(
            "--allow-domain",
            action="append",
            default=[],
            metavar="D",
            dest="allow_domains",
            help="a destination the isolated network may reach (domain, *.suffix)",
        )
    parser.add_argument(
        "--allow-private-domain",
        action="append",
        default=[],
        metavar="D",
        dest="allow_private_domains",
        help="an allowed name whose DNS answer may be a private address (10.x, fd00::, ...; "
        "never loopback or cloud metadata)",
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        type=pin_arg,
        metavar="NAME=ADDRESS",
        dest="pins",
        help="answer NAME with ADDRESS for the egress proxy, whatever its range (a mirror "
        "on the LAN or this host); repeatable, adds to the config's pin table",
    )
    parser.add_argument(
        "--hosts-file",
        metavar="PATH",
        default=None,
        help="the hosts file whose entries pin answers (default: /etc/hosts; '' for none)",
    )


def egress_settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """(overrides, list additions) for `build_config` from the parsed egress flags."""
    overrides: dict[str, Any] = {}
    pins: dict[str, list[str]] = {}
    for name, address in getattr(args, "pins", None) or ():
        pins.setdefault(name, []).append(address)
    if pins:
        overrides["pin"] = pins
    if getattr(args, "hosts_file", None) is not None:
        overrides["hosts_file"] = os.path.abspath(args.hosts_file) if args.hosts_file else ""
    additions = {
        name: list(values)
        for name in ("allow_domains", "allow_private_domains")
        if (values := getattr(args, name, None))
    }
    return overrides, additions
