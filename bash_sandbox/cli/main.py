"""`bash-sandbox`: run one command confined, set a session's mode, and check the host.

Subcommands: `run` (one command under a `SandboxBashExecutor`), `mode` (show or set a
session's override in a JSON-lines session log), `doctor` (what this host enforces) and
`mcp` (a confined bash tool server over MCP stdio, `mcp_server`).
Configuration comes from `cli_config` (a TOML file), flags override it.

Exit codes:

=========  ====================================================================
N          `run`: the command's own exit status
128+n      `run`: the command was killed by signal n (timeouts included)
130        `run`: bash-sandbox got SIGINT (Ctrl-C); the command's group was killed
143 / 129  `run`: the same for SIGTERM / SIGHUP
0 / 1      `doctor`: at least one backend is usable / none is
2          usage or configuration error: bad flag, bad config value, unknown mode,
           missing workspace, unreadable session log (nothing ran)
125        the sandbox is unavailable: no backend can enforce the mode (nothing ran)
126        the command could not be started, e.g. no bash on this host (nothing ran)
=========  ====================================================================
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from bash_sandbox.audit.command import add_audit_arguments
from bash_sandbox.cli.config_file import ConfigError, build_config, load_config
from bash_sandbox.cli.mcp_command import MCP_EPILOG, add_mcp_arguments
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.executor import SandboxBashExecutor
from bash_seam import (
    BashExecError,
    BashExecRequest,
    BashRunResult,
    CollectedOutput,
    InvalidRequestError,
    WorkdirError,
)
from policies import (
    JsonlSessionLog,
    NetworkMode,
    PolicyError,
    SandboxMode,
    effective_sandbox_mode,
    network_denial_marker,
    sandbox_denial_marker,
    set_sandbox_mode,
)

PROG = "bash-sandbox"
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 125
EXIT_CANNOT_START = 126
# Signals that end bash-sandbox itself: each kills the command's group first. The command
# runs in its own session, so a terminal's Ctrl-C never reaches it directly.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CliError(Exception):
    """A failure reported as one `bash-sandbox: ...` line (and, with --json, an error object)."""

    def __init__(self, message: str, exit_code: int, code: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.code = code


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bash-sandbox")
    except PackageNotFoundError:
        return "unknown"


# -- argument parsing --------------------------------------------------------------------------


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


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


_MODES = ", ".join(m.value for m in SandboxMode)

_MAIN_EPILOG = """\
examples:
  bash-sandbox run -- 'ls -la && cat README.md'
  bash-sandbox run --mode workspace-write -- make test
  bash-sandbox mode --session .session.jsonl workspace-write
  bash-sandbox doctor

configuration: [tool.bash-sandbox] in the workspace's pyproject.toml, or --config FILE
(keys are SandboxBashConfig fields, e.g. mode, network, backend, timeout_ms);
command-line flags win over the file.
"""

_RUN_EPILOG = f"""\
modes: {_MODES}
mode precedence: --mode > the session's override (--session) > the configured default.

examples:
  bash-sandbox run -- git status
  bash-sandbox run --mode workspace-write --workspace ~/src/app -- 'npm ci && npm test'
  bash-sandbox run --network host --mode workspace-write -- pip download requests
  bash-sandbox run --json -- 'echo hi'
  bash-sandbox run --session .session.jsonl -- pytest -q

exit status: the command's (128+n when killed by signal n); 130 on Ctrl-C;
2 usage or config error; 125 sandbox unavailable; 126 command could not start.
"""

_MODE_EPILOG = f"""\
modes: {_MODES}

examples:
  bash-sandbox mode --session .session.jsonl                    # show
  bash-sandbox mode --session .session.jsonl workspace-write    # set
"""

_DOCTOR_EPILOG = """\
examples:
  bash-sandbox doctor
  bash-sandbox doctor --json | jq '.backends[] | {name, usable}'
  bash-sandbox doctor --network host

exit status: 0 when at least one backend is usable here, 1 otherwise.
"""


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run shell commands confined: bubblewrap or Landlock on Linux, "
        "Seatbelt on macOS.",
        epilog=_MAIN_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    config_help = (
        "TOML config file (default: [tool.bash-sandbox] in the workspace's pyproject.toml)"
    )
    parser.add_argument("--config", metavar="PATH", default=None, help=config_help)
    # Also accepted after the subcommand; SUPPRESS keeps the top-level value otherwise.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=config_help)
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run",
        parents=[common],
        formatter_class=formatter,
        epilog=_RUN_EPILOG,
        help="run one command confined",
        description="Run COMMAND with `bash -c` inside the sandbox; print its stdout and "
        "stderr and exit with its status.",
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
        type=_positive_int,
        metavar="N",
        help="kill the command after N milliseconds (default: the config's timeout_ms, 120000)",
    )
    run.add_argument(
        "--session", metavar="FILE", help="JSON-lines session log whose mode override applies"
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print the whole result as JSON on stdout instead of the output",
    )
    run.add_argument(
        "command",
        nargs="*",
        metavar="COMMAND",
        help="the command, after `--`; several words are joined with spaces",
    )
    run.set_defaults(handler=_cmd_run)

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
        help="where to look for pyproject.toml (default: the current directory)",
    )
    mode.add_argument(
        "mode", nargs="?", type=_mode_arg, metavar="MODE", help=f"the new mode ({_MODES})"
    )
    mode.set_defaults(handler=_cmd_mode)

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
    doctor.set_defaults(handler=_cmd_doctor)

    audit = sub.add_parser(
        "audit",
        parents=[common],
        formatter_class=formatter,
        help="attack this host's sandbox with every threat-model row",
        description="Run every row of the threat model as real attacks against each usable "
        "backend and mode, check the host from outside, and print a table (exit 0 only when "
        "nothing escaped and every positive control works).",
    )
    add_audit_arguments(audit)
    audit.set_defaults(handler=_cmd_audit)

    mcp = sub.add_parser(
        "mcp",
        parents=[common],
        formatter_class=formatter,
        epilog=MCP_EPILOG,
        help="serve confined bash tools to an MCP client (stdio)",
        description="Serve bash_run, bash_start, bash_read, bash_kill and bash_list over MCP "
        "stdio, every command confined by one long-lived sandbox.",
    )
    add_mcp_arguments(mcp)
    mcp.set_defaults(handler=_cmd_mcp)
    return parser


def _cmd_mcp(args: argparse.Namespace) -> int:
    # Imported here: `run` and the other subcommands never load the MCP SDK.
    from bash_sandbox.cli.mcp_command import mcp_main

    return mcp_main(args)


def _cmd_audit(args: argparse.Namespace) -> int:
    # Imported here: the attack catalog is only needed by this subcommand.
    from bash_sandbox.audit.command import audit_main

    return audit_main(args)


# -- shared steps --------------------------------------------------------------------------


def _workspace_dir(raw: str | None) -> str:
    """The workspace as a canonical existing directory; the current directory by default."""
    try:
        path = os.path.realpath(os.path.expanduser(raw) if raw else os.getcwd())
    except FileNotFoundError:
        raise CliError(
            "the current directory no longer exists; pass --workspace",
            EXIT_USAGE,
            "WORKSPACE_INVALID",
        ) from None
    if not os.path.isdir(path):
        raise CliError(
            f"workspace {raw!r} is not an existing directory", EXIT_USAGE, "WORKSPACE_INVALID"
        )
    return path


def _open_session(path: str) -> JsonlSessionLog:
    try:
        return JsonlSessionLog(path)
    except OSError as exc:
        raise CliError(
            f"cannot open session log {path}: {exc.strerror or exc}",
            EXIT_USAGE,
            "SESSION_UNREADABLE",
        ) from None


def _config_error(exc: ConfigError | PolicyError, source: str | None = None) -> CliError:
    # A ConfigError names its source itself; a PolicyError (raised later, by the policy
    # service) gets it appended here.
    where = f" (in {source})" if source and isinstance(exc, PolicyError) else ""
    return CliError(f"config error: {exc}{where}", EXIT_USAGE, exc.code)


def command_text(words: Sequence[str]) -> str:
    """The command as bash will see it: one word as is, several joined with spaces."""
    return words[0] if len(words) == 1 else " ".join(words)


# -- run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interrupted:
    """bash-sandbox itself was told to stop; the command's group was killed."""

    signum: int


def signal_number(name: str) -> int | None:
    """``"SIGKILL"`` -> 9; ``"SIG40"`` (an unnamed real-time signal) -> 40."""
    with contextlib.suppress(KeyError):
        return int(signal.Signals[name])
    digits = name.removeprefix("SIG")
    return int(digits) if digits.isdigit() else None


def exit_status(result: BashRunResult) -> int:
    """The shell convention: the command's status, or 128+n when signal n killed it."""
    if result.exit_code is not None:
        return result.exit_code
    if result.signal is not None:
        number = signal_number(result.signal)
        if number is not None:
            return 128 + number
    return 1  # neither an exit code nor a known signal: report a plain failure


def _write_output(stream: TextIO, output: CollectedOutput) -> None:
    # A truncated stream is kept whole in its spill file: print that, byte for byte, and
    # remove it (nobody else will read it). Otherwise the decoded text is all there is.
    if output.truncated and output.spill_path:
        try:
            with open(output.spill_path, "rb") as fh:
                stream.flush()
                binary = getattr(stream, "buffer", None)
                if binary is not None:
                    shutil.copyfileobj(fh, binary)
                    binary.flush()
                else:
                    stream.write(fh.read().decode(errors="replace"))
            os.unlink(output.spill_path)
            return
        except OSError:
            pass  # spill gone or unreadable: fall back to the tail
    stream.write(output.text)
    stream.flush()


def report_result(result: BashRunResult, *, as_json: bool, stdout: TextIO, stderr: TextIO) -> int:
    """Print ``result`` the way the user asked; returns the exit status."""
    if as_json:
        stdout.write(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
        stdout.flush()
        return exit_status(result)
    _write_output(stdout, result.stdout)
    _write_output(stderr, result.stderr)
    notes: list[str] = []
    if result.stdout.truncated and not result.stdout.spill_path:
        notes.append(f"{PROG}: stdout was too large; only its tail is shown")
    if result.stderr.truncated and not result.stderr.spill_path:
        notes.append(f"{PROG}: stderr was too large; only its tail is shown")
    if result.timed_out:
        notes.append(f"{PROG}: timed out after {result.timeout_ms} ms; the command was killed")
    facts = result.sandbox
    if facts is not None and facts.denied:
        notes.append(sandbox_denial_marker(facts.mode))
    if facts is not None and facts.network_denied:
        notes.append(network_denial_marker())
    if notes:
        # The markers go on a line of their own even when the command's stderr did not end one.
        needs_newline = bool(result.stderr.text) and not result.stderr.text.endswith("\n")
        stderr.write(("\n" if needs_newline else "") + "\n".join(notes) + "\n")
        stderr.flush()
    return exit_status(result)


def _install_interrupt_handlers(
    loop: asyncio.AbstractEventLoop, on_signal: Callable[[int], None]
) -> list[tuple[int, Any]]:
    """Route the interrupt signals to ``on_signal``; returns what to restore afterwards."""
    installed: list[tuple[int, Any]] = []
    for sig in INTERRUPT_SIGNALS:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue  # inherited "ignore" (nohup, a background job): keep ignoring it
        try:
            loop.add_signal_handler(sig, on_signal, int(sig))
        except (ValueError, RuntimeError, NotImplementedError):
            break  # not the main thread (an embedding caller): keep the default handlers
        installed.append((int(sig), previous))
    return installed


def _restore_handlers(loop: asyncio.AbstractEventLoop, installed: list[tuple[int, Any]]) -> None:
    for sig, previous in installed:
        loop.remove_signal_handler(sig)
        # remove_signal_handler resets to the default; an embedding caller had its own.
        if previous is not None:
            signal.signal(sig, previous)


async def run_until_interrupted(
    executor: SandboxBashExecutor, request: BashExecRequest
) -> BashRunResult | Interrupted:
    """Run ``request``; a SIGINT/SIGTERM/SIGHUP to us cancels the run, which kills the
    command's process group before the cancellation propagates. Closes ``executor``."""
    loop = asyncio.get_running_loop()
    received: list[int] = []
    task: asyncio.Future[BashRunResult] | None = None

    def on_signal(signum: int) -> None:
        received.append(signum)
        if task is not None:
            task.cancel()

    # Installed for the whole run, `aclose()` included, so no signal ever lands as a
    # KeyboardInterrupt in the middle of the executor's cleanup.
    installed = _install_interrupt_handlers(loop, on_signal)
    try:
        spec = executor.resolve(request)
        # A signal that lands before the task's first step cancels it before it spawns.
        task = asyncio.ensure_future(executor.run(spec))
        try:
            return await task
        except asyncio.CancelledError:
            if not received:
                raise
            return Interrupted(received[0])
    finally:
        try:
            await executor.aclose()
        finally:
            _restore_handlers(loop, installed)


def _run_config(args: argparse.Namespace, workspace: str) -> tuple[SandboxBashConfig, str | None]:
    """The validated config for `run`, and where its file values came from."""
    loaded = load_config(args.config, workspace)
    overrides: dict[str, Any] = {}
    if args.workspace is not None or "workspace_root" not in loaded.values:
        overrides["workspace_root"] = workspace
    if args.network is not None:
        overrides["network"] = args.network
    if args.backend is not None:
        overrides["backend"] = args.backend
    if args.timeout_ms is not None:
        overrides["timeout_ms"] = args.timeout_ms
    config = build_config(loaded, overrides)
    if args.timeout_ms is not None and args.timeout_ms > config.max_timeout_ms:
        # An explicit flag is the user's own decision: lift the cap instead of silently
        # shortening the timeout they asked for.
        config = build_config(loaded, overrides | {"max_timeout_ms": args.timeout_ms})
    return config, loaded.source.describe() if loaded.source else None


def _cmd_run(args: argparse.Namespace) -> int:
    if not args.command:
        raise CliError(
            "run: no command given (usage: bash-sandbox run [options] -- COMMAND)",
            EXIT_USAGE,
            "USAGE",
        )
    workspace = _workspace_dir(args.workspace)
    config, source = _run_config(args, workspace)
    workdir = workspace if args.workspace is not None else (config.cwd or workspace)
    session = _open_session(args.session) if args.session else None
    try:
        try:
            executor = SandboxBashExecutor(config)
        except PolicyError as exc:  # e.g. a relative path in writable_roots
            raise _config_error(exc, source) from None
        mode = executor.policy_service.resolve_mode(session, args.mode)
        request = BashExecRequest(
            command=command_text(args.command), workdir=workdir, sandbox_mode=mode
        )
        try:
            outcome = asyncio.run(run_until_interrupted(executor, request))
        except SandboxUnavailableError as exc:
            raise CliError(str(exc), EXIT_UNAVAILABLE, exc.code) from None
        except PolicyError as exc:
            raise CliError(str(exc), EXIT_USAGE, exc.code) from None
        except (WorkdirError, InvalidRequestError) as exc:
            raise CliError(str(exc), EXIT_USAGE, exc.code) from None
        except BashExecError as exc:  # no bash, or the spawn itself failed
            raise CliError(str(exc), EXIT_CANNOT_START, exc.code) from None
    finally:
        if session is not None:
            session.close()
    if isinstance(outcome, Interrupted):
        name = signal.Signals(outcome.signum).name
        status = 128 + outcome.signum
        _print_error(
            args, CliError(f"{name}: the command's process group was killed", status, "INTERRUPTED")
        )
        return status
    return report_result(outcome, as_json=args.json, stdout=sys.stdout, stderr=sys.stderr)


# -- mode ----------------------------------------------------------------------------------


def _cmd_mode(args: argparse.Namespace) -> int:
    if args.mode is not None:
        with _open_session(args.session) as session:
            new_mode = set_sandbox_mode(session, args.mode)
        print(new_mode.value)
        return 0
    workspace = _workspace_dir(args.workspace)
    config = build_config(load_config(args.config, workspace), {})
    override = None
    # Showing must not create the log as a side effect.
    if os.path.exists(args.session):
        with _open_session(args.session) as session:
            override = effective_sandbox_mode(session.events)
    print(override.value if override is not None else f"default ({config.mode.value})")
    return 0


# -- doctor --------------------------------------------------------------------------------


def _cmd_doctor(args: argparse.Namespace) -> int:
    from bash_sandbox.cli.doctor import collect_report, render_text

    config = build_config(load_config(args.config, _workspace_dir(None)), {})
    report = collect_report(
        config,
        network=args.network or config.network,
        version=package_version(),
    )
    if args.json:
        payload = report.model_dump(mode="json") | {"usable": report.usable}
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report))
    sys.stdout.flush()
    return 0 if report.usable else 1


# -- entry point ---------------------------------------------------------------------------


def _print_error(args: argparse.Namespace, error: CliError) -> None:
    sys.stderr.write(f"{PROG}: {error}\n")
    sys.stderr.flush()
    if getattr(args, "json", False):
        # A JSON consumer reads stdout only: tell it why there is no result.
        payload = {
            "error": {"code": error.code, "message": str(error), "exit_code": error.exit_code}
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: `sys.argv[1:]`); returns the exit status."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            hint = (
                " (put the command after `--`: bash-sandbox run -- COMMAND)"
                if args.subcommand == "run"
                else ""
            )
            parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    except SystemExit as exc:  # --help, --version and usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ConfigError as exc:
        _print_error(args, _config_error(exc))
        return EXIT_USAGE
    except CliError as exc:
        _print_error(args, exc)
        return exc.exit_code
    except KeyboardInterrupt:
        # A Ctrl-C before the run's own handler was installed: nothing is running yet.
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter's final
        # flush from failing again on the dead pipe.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    raise SystemExit(main())
