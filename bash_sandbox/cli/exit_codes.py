"""The CLI's exit statuses, and `CliError`, the failure that carries one.

`EXIT_STATUSES` is the one table: `run --help`, docs/cli.md and the README show it, and
tests/cli/test_cli_exit_codes.py runs the CLI for every row and checks the docs against it.
"""

from __future__ import annotations

from typing import NamedTuple

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 125
EXIT_CANNOT_START = 126
EXIT_NOT_FOUND = 127  # bash's own: the command named no program
EXIT_SIGTERM = 143  # 128 + SIGTERM: a timeout, or bash-sandbox itself was told to stop


class ExitStatus(NamedTuple):
    status: str  # as shown: "0", "2", "128+n"
    meaning: str


# `run`'s statuses, in the order shown.
EXIT_STATUSES: tuple[ExitStatus, ...] = (
    ExitStatus("0", "the command succeeded"),
    ExitStatus("N", "the command's own exit status (bash's 126/127: not executable/not found)"),
    ExitStatus(
        "2",
        "usage or configuration error: bad flag or value, bad or untrusted config, unknown "
        "mode, unusable workspace or workdir, a limit below its minimum, an environment too "
        "large to exec (nothing ran)",
    ),
    ExitStatus("125", "the sandbox is unavailable: no backend can enforce the mode (nothing ran)"),
    ExitStatus("126", "the command could not be started, e.g. no bash on this host (nothing ran)"),
    ExitStatus(
        "128+n",
        "the command was killed by signal n; a timeout is 143 (SIGTERM) or 137 (SIGKILL after "
        "the grace); `--json` tells them apart in `outcome`",
    ),
    ExitStatus(
        "130/143/129", "bash-sandbox got SIGINT/SIGTERM/SIGHUP; the command's group was killed"
    ),
    ExitStatus(
        "141", "the reader of stdout went away (a pipe to `head`); the command's group was killed"
    ),
)


def exit_status_help() -> str:
    """The table as `--help` shows it."""
    width = max(len(row.status) for row in EXIT_STATUSES)
    lines = ["exit status:"]
    lines += [f"  {row.status:<{width}}  {row.meaning}" for row in EXIT_STATUSES]
    return "\n".join(lines) + "\n"


def exit_status_markdown() -> str:
    """The table as docs/cli.md and the README show it."""
    lines = ["| status | meaning |", "|---|---|"]
    lines += [f"| {row.status} | {row.meaning} |" for row in EXIT_STATUSES]
    return "\n".join(lines) + "\n"


class CliError(Exception):
    """A failure reported as one `bash-sandbox: ...` line (and, with --json, an error object)."""

    def __init__(self, message: str, exit_code: int, code: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.code = code
