"""The `bash-sandbox` argument parser: subcommands, flags, value types and help texts.

`build_parser()` returns a parser whose usage errors raise `UsageError` instead of printing
and exiting, so `main` can also report them as a JSON error object under `--json`.
`--help` and `--version` still print and exit 0 the argparse way.

Building it stays cheap for `run`: the `audit` and `mcp` flags are added only when that
subcommand is parsed or its help shown (their modules are cold), and the version is looked
up only when `--version` asks for it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from bash_sandbox.cli.egress_flags import add_publish_flag
from bash_sandbox.cli.exit_codes import exit_status_help
from bash_sandbox.cli.settings import MODES, add_shared_flags
from policies import NetworkMode, SandboxMode
from policies.units import parse_size

PROG = "bash-sandbox"
# `run --stdin` reads the input whole before the command starts: bounded like its output.
STDIN_MAX_BYTES = 64 << 20


class UsageError(Exception):
    """A bad command line; ``usage`` is the usage text of the (sub)command that failed."""

    code = "USAGE"

    def __init__(self, message: str, usage: str, prog: str) -> None:
        super().__init__(message)
        self.usage = usage
        self.prog = prog


class CliArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` that raises `UsageError`; its subparsers are of the same class.

    ``deferred`` adds the parser's own arguments the first time it parses or formats
    anything, so a subcommand whose flags live in a cold module costs nothing until used.
    """

    def __init__(
        self,
        *args: Any,
        deferred: Callable[[argparse.ArgumentParser], None] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self._deferred = deferred

    def _add_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._add_deferred()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._add_deferred()
        return super().format_usage()

    def format_help(self) -> str:
        self._add_deferred()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage(), self.prog)


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for (reading package metadata costs a few ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str, lookup: Callable[[], str]):
        super().__init__(
            option_strings, dest, nargs=0, help="show program's version number and exit"
        )
        self._lookup = lookup

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        sys.stdout.write(f"{parser.prog} {self._lookup()}\n")  # on stdout, as argparse's own
        parser.exit()


def wants_json(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asked for `--json` (before `--`), even when it failed to parse."""
    for word in argv:
        if word == "--":
            return False
        # argparse accepts unique prefixes: `--js` is `--json` (no other flag starts `--j`).
        if len(word) > 3 and word.startswith("--j") and "--json".startswith(word):
            return True
    return False


# -- value types -------------------------------------------------------------------------------


def _mode_arg(value: str) -> SandboxMode:
    try:
        return SandboxMode(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _network_arg(value: str) -> NetworkMode:
    try:
        return NetworkMode(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size_bytes(value: str) -> int:
    """``"512M"`` -> 536870912, in the one units grammar (`policies.units`)."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- help texts --------------------------------------------------------------------------------

_MODES = MODES

_MAIN_EPILOG = """\
examples:
  bash-sandbox run -- 'ls -la && cat README.md'
  bash-sandbox run --mode workspace-write -- make test
  bash-sandbox mode --session ~/.local/state/agent/session.jsonl workspace-write
  bash-sandbox doctor

configuration: --config FILE, else ~/.config/bash-sandbox/config.toml ($XDG_CONFIG_HOME);
keys are SandboxBashConfig fields, e.g. mode, network, backend, timeout_ms, writable_roots;
command-line flags win over the file. The workspace's pyproject.toml is never read.
"""

_RUN_EPILOG = f"""\
modes: {_MODES}
mode precedence: --mode > the session's override (--session) > the configured default.
list flags (--writable-root, --deny-read, --protected-path, --unprotected-path,
--allow-domain) add to the config file's lists; sizes take K, M, G or T (powers of 1024:
512M, 2G), durations ms, s, m or h (500ms, 30s; a bare number is milliseconds), in flags
and config alike.

examples:
  bash-sandbox run -- git status
  bash-sandbox run --mode workspace-write --workspace ~/src/app -- 'npm ci && npm test'
  bash-sandbox run --mode workspace-write --writable-root ~/.cache/build -- make
  bash-sandbox run --memory 2G --max-processes 256 -- pytest -q
  bash-sandbox run --json -- 'echo hi'

"""

_MODE_EPILOG = f"""\
modes: {_MODES}

examples:
  bash-sandbox mode --session ~/.local/state/agent/session.jsonl                   # show
  bash-sandbox mode --session ~/.local/state/agent/session.jsonl workspace-write   # set
"""

_DOCTOR_EPILOG = """\
examples:
  bash-sandbox doctor
  bash-sandbox doctor --json | jq '.backends[] | {name, usable}'
  bash-sandbox doctor --network host

exit status: 0 when at least one backend is usable here, 1 otherwise.
"""


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    # The audit is its own package, found through its entry point (`plugins`).
    from bash_sandbox.cli.plugins import load_subcommand

    load_subcommand("audit").add_arguments(parser)


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    from bash_sandbox.cli.mcp_command import MCP_EPILOG, add_mcp_arguments

    parser.epilog = MCP_EPILOG
    add_mcp_arguments(parser)


def build_parser(version: str | Callable[[], str]) -> CliArgumentParser:
    """The whole command line; ``version`` (or what it returns, called only for `--version`)
    is what `--version` prints after the name."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = CliArgumentParser(
        prog=PROG,
        description="Run shell commands confined: bubblewrap or Landlock on Linux, "
        "Seatbelt on macOS.",
        epilog=_MAIN_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        lookup=version if callable(version) else lambda: version,
    )
    config_help = (
        "TOML config file (default: ~/.config/bash-sandbox/config.toml; "
        "refused inside the workspace or a writable root)"
    )
    parser.add_argument("--config", metavar="PATH", default=None, help=config_help)
    # Also accepted after the subcommand; SUPPRESS keeps the top-level value otherwise.
    common = CliArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=config_help)
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run",
        parents=[common],
        formatter_class=formatter,
        epilog=_RUN_EPILOG + exit_status_help(),
        help="run one command confined",
        description="Run COMMAND with `bash -c` inside the sandbox; stream its stdout and "
        "stderr as they are written and exit with its status.",
    )
    add_shared_flags(run)
    add_publish_flag(run)
    run.add_argument(
        "--json",
        action="store_true",
        help="print the whole result as JSON on stdout instead of streaming the output",
    )
    run.add_argument(
        "--stdin",
        action="store_true",
        help="give the command this process's standard input (read to its end before the "
        f"command starts, at most {STDIN_MAX_BYTES >> 20} MiB); without it the command's is "
        "empty",
    )
    run.add_argument(
        "command",
        nargs="*",
        metavar="COMMAND",
        help="the command, after `--`; several words are joined with spaces",
    )

    mode = sub.add_parser(
        "mode",
        parents=[common],
        formatter_class=formatter,
        epilog=_MODE_EPILOG,
        help="show or set a session's sandbox mode",
        description="Without MODE, print the session's mode override (or 'default (<mode>)' "
        "when it has none); with MODE, record it as the session's override.",
    )
    mode.add_argument(
        "--session",
        metavar="FILE",
        required=True,
        help="JSON-lines session log (created when MODE is set)",
    )
    mode.add_argument(
        "--workspace",
        metavar="DIR",
        help="the workspace the default mode is for (default: the current directory)",
    )
    mode.add_argument(
        "mode", nargs="?", type=_mode_arg, metavar="MODE", help=f"the new mode ({_MODES})"
    )

    doctor = sub.add_parser(
        "doctor",
        parents=[common],
        formatter_class=formatter,
        epilog=_DOCTOR_EPILOG,
        help="report what this host can enforce",
        description="Probe every backend and the host (Landlock ABI, user and network "
        "namespaces) and report how each layer is enforced here.",
    )
    doctor.add_argument(
        "--network",
        type=_network_arg,
        metavar="NET",
        help="report the layers for this network mode (default: the configured one)",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")

    sub.add_parser(
        "audit",
        parents=[common],
        formatter_class=formatter,
        deferred=_audit_arguments,
        help="attack this host's sandbox with every threat-model row",
        description="Run every row of the threat model as real attacks against each usable "
        "backend and mode, check the host from outside, and print a table (exit 0 only when "
        "nothing escaped and every positive control works).",
    )
    sub.add_parser(
        "mcp",
        parents=[common],
        formatter_class=formatter,
        deferred=_mcp_arguments,
        help="serve confined bash tools to an MCP client (stdio)",
        description="Serve bash_run, bash_start, bash_read, bash_kill and bash_list over MCP "
        "stdio, every command confined by one long-lived sandbox.",
    )
    return parser
