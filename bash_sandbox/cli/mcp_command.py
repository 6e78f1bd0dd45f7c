"""`bash-sandbox mcp`: its command line only.

Kept apart from `mcp_server` so that building the CLI's parser (for `run`, `doctor`, ...)
never imports the MCP SDK; the server module is imported when `mcp` actually runs.
"""

from __future__ import annotations

import argparse
import sys

from bash_sandbox.cli.settings import add_shared_flags
from policies import SandboxMode

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
    # The flags `run` has too, declared once (`settings`), then the server's own.
    add_shared_flags(parser)
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
