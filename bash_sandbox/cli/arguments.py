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
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from policies import NetworkMode, SandboxMode

PROG = "bash-sandbox"


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


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


_SIZE = re.compile(r"(?P<number>[0-9]+)(?P<unit>[KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size_bytes(value: str) -> int:
    """``"512M"`` -> 536870912: bytes, or K/M/G/T (powers of 1024, `KiB`/`MB` accepted)."""
    match = _SIZE.fullmatch(value.strip())
    number = int(match["number"]) * _UNITS[match["unit"].upper()] if match else 0
    if number <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 512M or 2G (bytes, K, M, G), got {value!r}"
        )
    return number


# -- help texts --------------------------------------------------------------------------------

_MODES = ", ".join(m.value for m in SandboxMode)

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
list flags (--writable-root, --deny-read, --protected-path, --allow-domain) add to the
config file's lists; sizes take K, M or G (powers of 1024).

examples:
  bash-sandbox run -- git status
  bash-sandbox run --mode workspace-write --workspace ~/src/app -- 'npm ci && npm test'
  bash-sandbox run --mode workspace-write --writable-root ~/.cache/build -- make
  bash-sandbox run --memory 2G --max-processes 256 -- pytest -q
  bash-sandbox run --json -- 'echo hi'

exit status: the command's (128+n when killed by signal n); 130 on Ctrl-C;
2 usage or config error; 125 sandbox unavailable; 126 command could not start.
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


def _add_policy_flags(run: argparse.ArgumentParser) -> None:
    """The repeatable path/domain flags and the resource limits of `run`."""
    lists = run.add_argument_group("policy lists (repeatable, added to the config file's)")
    lists.add_argument(
        "--writable-root",
        action="append",
        default=[],
        metavar="DIR",
        dest="writable_roots",
        help="another existing directory writable under workspace-write (~/ allowed)",
    )
    lists.add_argument(
        "--deny-read",
        action="append",
        default=[],
        metavar="PATH",
        dest="deny_read",
        help="a path no confined command may read (added to the default credential stores)",
    )
    lists.add_argument(
        "--protected-path",
        action="append",
        default=[],
        metavar="NAME",
        dest="protected_paths",
        help="a name kept read-only inside every writable root, e.g. .env",
    )
    lists.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        metavar="D",
        dest="allow_domains",
        help="a destination the isolated network may reach (domain, *.suffix)",
    )
    from bash_sandbox.cli.egress_flags import add_egress_flags, add_publish_flag

    add_egress_flags(lists, allow_domain=False)
    add_publish_flag(run)
    limits = run.add_argument_group("limits (per command, its whole process tree)")
    limits.add_argument("--memory", type=size_bytes, metavar="SIZE", help="memory, e.g. 2G")
    limits.add_argument("--max-processes", type=positive_int, metavar="N", help="processes")
    limits.add_argument("--cpus", type=positive_number, metavar="N", help="CPU cores, e.g. 1.5")
    limits.add_argument("--tmp-size", type=size_bytes, metavar="SIZE", help="private /tmp size")
    limits.add_argument("--shm-size", type=size_bytes, metavar="SIZE", help="private /dev/shm size")
    limits.add_argument(
        "--max-open-files", type=positive_int, metavar="N", help="open files per process"
    )


# argparse dest -> `ResourceLimits` field.
LIMIT_FLAGS = {
    "memory": "memory_bytes",
    "max_processes": "processes",
    "cpus": "cpu_cores",
    "tmp_size": "tmp_bytes",
    "shm_size": "shm_bytes",
    "max_open_files": "open_files",
}
LIST_FLAGS = ("writable_roots", "deny_read", "protected_paths", "allow_domains")


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
        epilog=_RUN_EPILOG,
        help="run one command confined",
        description="Run COMMAND with `bash -c` inside the sandbox; stream its stdout and "
        "stderr as they are written and exit with its status.",
    )
    run.add_argument(
        "--mode", type=_mode_arg, metavar="MODE", help=f"sandbox mode for this command ({_MODES})"
    )
    run.add_argument(
        "--workspace",
        metavar="DIR",
        help="workspace root and working directory (default: the current directory)",
    )
    run.add_argument(
        "--network",
        type=_network_arg,
        metavar="NET",
        help="isolated (own loopback only, the default) or host",
    )
    run.add_argument(
        "--backend",
        choices=("auto", "bwrap", "landlock", "seatbelt"),
        help="sandbox backend (default: auto)",
    )
    run.add_argument(
        "--timeout-ms",
        type=positive_int,
        metavar="N",
        help="kill the command after N milliseconds (default: the config's timeout_ms, 120000)",
    )
    run.add_argument(
        "--session",
        metavar="FILE",
        help="JSON-lines session log whose mode override applies (refused inside a writable root)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print the whole result as JSON on stdout instead of streaming the output",
    )
    _add_policy_flags(run)
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
