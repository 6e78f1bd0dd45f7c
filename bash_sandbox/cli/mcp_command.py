"""`bash-sandbox mcp`: its command line only.

Kept apart from `mcp_server` so that building the CLI's parser (for `run`, `doctor`, ...)
never imports the MCP SDK; the server module is imported when `mcp` actually runs.
"""

from __future__ import annotations

import argparse
import sys

from policies import NetworkMode, SandboxMode

_MODES = [m.value for m in SandboxMode]

MCP_EPILOG = """\
Serves MCP over stdin/stdout (nothing else is ever written to stdout; logs go to stderr).
Tools: bash_run, bash_start, bash_read, bash_kill, bash_list. All commands share one
long-lived sandbox; every background command dies with the server.

escalation: with --allow-escalation-to MODE the tools accept a per-call sandbox_mode up to
MODE (and with --allow-network-escalation a per-call network=host); each widening call is
approved by the user through MCP elicitation first, or refused.

examples:
  bash-sandbox mcp --workspace ~/src/app
  bash-sandbox mcp --workspace ~/src/app --mode workspace-write \\
      --allow-escalation-to danger-full-access --session ~/.local/state/app-session.jsonl

client configuration (e.g. claude_desktop_config.json / .mcp.json):
  {"mcpServers": {"bash-sandbox": {"command": "bash-sandbox",
    "args": ["mcp", "--workspace", "/path/to/project", "--mode", "workspace-write"]}}}
"""


def add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workspace",
        metavar="DIR",
        help="workspace root; relative workdirs start here (default: the current directory)",
    )
    parser.add_argument(
        "--mode",
        choices=_MODES,
        metavar="MODE",
        help=f"default sandbox mode of every call ({', '.join(_MODES)}; default: the config's)",
    )
    parser.add_argument(
        "--network",
        choices=[n.value for n in NetworkMode],
        metavar="NET",
        help="isolated (own loopback only, the default) or host",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "bwrap", "landlock", "seatbelt"),
        help="sandbox backend (default: auto)",
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        metavar="N",
        help="default timeout of bash_run (default: the config's timeout_ms, 120000)",
    )
    parser.add_argument(
        "--allow-escalation-to",
        choices=_MODES,
        metavar="MODE",
        help="let a call ask for a wider sandbox mode, up to MODE, after the user approves",
    )
    parser.add_argument(
        "--allow-network-escalation",
        action="store_true",
        help="let a call ask for network=host, after the user approves",
    )
    parser.add_argument(
        "--session",
        metavar="FILE",
        help="JSON-lines session log: its mode override applies, and an approval 'for this "
        "session' is recorded there (must lie outside the workspace and every writable root)",
    )
    from bash_sandbox.cli.egress_flags import add_egress_flags

    add_egress_flags(parser, allow_domain=True)


MCP_EXTRA_MISSING = (
    "bash-sandbox mcp needs the MCP SDK, an optional extra: pip install 'bash-sandbox[mcp]'"
)


def mcp_main(args: argparse.Namespace) -> int:
    # Imported here: the MCP SDK is only needed once the server really starts, and it is an
    # extra (a confinement library does not pull a server stack into every install).
    try:
        import mcp  # noqa: F401
    except ImportError:
        sys.stderr.write(f"{MCP_EXTRA_MISSING}\n")
        return 2
    from bash_sandbox.cli.mcp_server import serve_main

    return serve_main(args)
