"""`bash-sandbox`: run one command confined, set a session's mode, and check the host.

Subcommands: `run` (one command under a `SandboxBashExecutor`, its output streamed live),
`mode` (show or set a session's override in a JSON-lines session log), `doctor` (what this
host enforces), `audit`, and `mcp` (a confined bash tool server over MCP stdio). The flags
are in `arguments`, the config file in `config_file`, live output in `stream`; this module
runs the subcommands and maps failures to exit codes.

Exit codes: `exit_codes.EXIT_STATUSES` (shown by `run --help`, docs/cli.md and the README);
`doctor` exits 0 when at least one backend is usable here, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from bash_sandbox.cli.arguments import (
    PROG,
    STDIN_MAX_BYTES,
    CliArgumentParser,
    UsageError,
    build_parser,
    wants_json,
)
from bash_sandbox.cli.config_file import (
    ConfigError,
    ConfigUntrustedError,
    build_config,
    config_roots,
    load_config,
    user_config_path,
    workspace_table_notice,
)
from bash_sandbox.cli.egress_flags import run_published
from bash_sandbox.cli.exit_codes import EXIT_CANNOT_START, EXIT_UNAVAILABLE, EXIT_USAGE, CliError
from bash_sandbox.cli.plugins import SubcommandMissingError
from bash_sandbox.cli.render import json_safe, one_line, render_visible
from bash_sandbox.cli.settings import package_version, shared_config, workspace_dir
from bash_sandbox.cli.stream import LiveOutput, is_terminal
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.executor import SandboxBashExecutor
from bash_sandbox.facts import git_outcome_text, result_markers
from bash_sandbox.publish import PublishError
from bash_seam import (
    BashExecError,
    BashExecRequest,
    BashRunResult,
    InvalidRequestError,
    WorkdirError,
)
from policies import (
    PolicyError,
    effective_sandbox_mode,
    network_denial_marker,
    sandbox_denial_marker,
    set_sandbox_mode,
)
from policies.log_location import session_log_refusal

if TYPE_CHECKING:
    from policies import JsonlSessionLog

# Signals that end bash-sandbox itself: each kills the command's group first. The command
# runs in its own session, so a terminal's Ctrl-C never reaches it directly.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _cmd_mcp(args: argparse.Namespace) -> int:
    # Imported here: `run` and the other subcommands never load the MCP SDK.
    from bash_sandbox.cli.mcp_command import mcp_main

    return mcp_main(args)


def _cmd_audit(args: argparse.Namespace) -> int:
    # The audit is its own package, never imported by the runtime: its entry point.
    from bash_sandbox.cli.plugins import load_subcommand

    return load_subcommand("audit").main(args)


# -- shared steps --------------------------------------------------------------------------


def _open_session(path: str) -> JsonlSessionLog:
    from policies import JsonlSessionLog  # only with --session

    try:
        return JsonlSessionLog(path)
    except OSError as exc:
        raise CliError(
            f"cannot open session log {path}: {exc.strerror or exc}",
            EXIT_USAGE,
            "SESSION_UNREADABLE",
        ) from None


def _read_stdin() -> bytes:
    """`run --stdin`: this process's standard input, whole (bounded)."""
    data = sys.stdin.buffer.read(STDIN_MAX_BYTES + 1)
    if len(data) > STDIN_MAX_BYTES:
        raise CliError(
            f"--stdin: more than {STDIN_MAX_BYTES >> 20} MiB of input; give the command a file "
            "in the workspace instead",
            EXIT_USAGE,
            "STDIN_TOO_LARGE",
        )
    return data


def _refuse_writable_session(path: str, config: SandboxBashConfig) -> None:
    """A session log inside a writable root could be given a wider mode by the command
    itself before the next run obeys it (threat-model row 15)."""
    refusal = session_log_refusal(path, config_roots(config))
    if refusal is not None:
        raise CliError(
            f"{refusal}; keep it outside every writable root", EXIT_USAGE, "SESSION_UNTRUSTED"
        )


def _config_error(exc: ConfigError | PolicyError, source: str | None = None) -> CliError:
    if isinstance(exc, ConfigUntrustedError):
        return CliError(f"untrusted config refused: {exc}", EXIT_USAGE, exc.code)
    # A ConfigError names its source itself; a PolicyError (raised later, by the policy
    # service) gets it appended here.
    where = f" (in {source})" if source and isinstance(exc, PolicyError) else ""
    return CliError(f"config error: {exc}{where}", EXIT_USAGE, exc.code)


def _print_notice(workspace: str) -> None:
    # On stderr in every output mode: a `--json` reader parses stdout only.
    notice = workspace_table_notice(workspace)
    if notice is not None:
        sys.stderr.write(f"{PROG}: {notice}\n")
        sys.stderr.flush()


def command_text(words: Sequence[str]) -> str:
    """The command as bash will see it: one word as is, several joined with spaces."""
    return words[0] if len(words) == 1 else " ".join(words)


# -- run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interrupted:
    """bash-sandbox itself was told to stop (a signal, or stdout's reader left); the
    command's group was killed."""

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


def run_outcome(result: BashRunResult) -> str:
    """Why the command ended, for `--json` (the exit status alone cannot tell a timeout's
    SIGTERM from one sent by someone else): ``exited``, ``timed-out``, ``aborted``, or
    ``signal`` (killed by a signal the executor did not send)."""
    if result.timed_out:
        return "timed-out"
    if result.aborted:
        return "aborted"
    return "exited" if result.exit_code is not None else "signal"


def result_notes(result: BashRunResult, *, streamed: bool, reader_held: bool = False) -> list[str]:
    """The CLI's lines after the output: truncation, timeout, denial markers.
    ``reader_held``: the command waited for this CLI's reader at some point (a pager)."""
    notes: list[str] = []
    if not streamed:
        for name, output in (("stdout", result.stdout), ("stderr", result.stderr)):
            if output.truncated:
                notes.append(f"{PROG}: {name} was too large; only its tail is shown")
    if result.timed_out:
        waited = (
            " (its output waited for this CLI's reader, a pager say: that time counts)"
            if reader_held
            else ""
        )
        notes.append(
            f"{PROG}: timed out after {result.timeout_ms} ms; the command was killed{waited}"
        )
    facts = result.sandbox
    # The contract's generic lines first (harnesses match them), then one line per denial.
    if facts is not None and facts.denied:
        notes.append(sandbox_denial_marker(facts.mode))
    if facts is not None and facts.network_denied:
        notes.append(network_denial_marker())
    notes += result_markers(facts)
    if facts is not None:
        notes += [f"{PROG}: {git_outcome_text(outcome)}" for outcome in facts.git]
    # What the sandbox says about itself (a degraded backend, git repositories the command
    # made, a cache home it could not use): after the markers, never instead of them.
    if facts is not None:
        notes += [f"{PROG}: warning: {warning}" for warning in facts.warnings]
    return notes


def report_result(
    result: BashRunResult,
    *,
    as_json: bool,
    stdout: TextIO,
    stderr: TextIO,
    live: LiveOutput | None = None,
) -> int:
    """Print what is left of ``result`` the way the user asked; returns the exit status.

    ``live`` is the output the command already streamed; without it the collected output
    (the tail, when truncated) is printed now.
    """
    if as_json:
        payload = result.model_dump(mode="json") | {"outcome": run_outcome(result)}
        stdout.write(json.dumps(json_safe(payload), indent=2) + "\n")
        stdout.flush()
        return exit_status(result)
    streamed = live is not None
    if live is None:
        live = LiveOutput(stdout, stderr)
        live.listener("stdout", result.stdout.text.encode())
        live.listener("stderr", result.stderr.text.encode())
    live.finish()
    live.write_notes(result_notes(result, streamed=streamed, reader_held=live.was_held))
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
    executor: SandboxBashExecutor,
    request: BashExecRequest,
    live: LiveOutput | None = None,
    publish: Sequence[int] = (),
    settled: Callable[[BashRunResult | Interrupted], None] | None = None,
) -> BashRunResult | Interrupted:
    """Run ``request``, streaming into ``live`` when given. A SIGINT/SIGTERM/SIGHUP to us,
    or stdout's reader going away, cancels the run, which kills the command's process
    group before the cancellation propagates. Closes ``executor``, after ``settled`` has
    seen the outcome (the command's group is dead by then, its git import done)."""
    loop = asyncio.get_running_loop()
    received: list[int] = []
    task: asyncio.Future[BashRunResult] | None = None

    def stop(signum: int) -> None:
        received.append(signum)
        if task is not None:
            task.cancel()

    if live is not None:
        live.on_stdout_closed = lambda: stop(signal.SIGPIPE)
    # Installed for the whole run, `aclose()` included, so no signal ever lands as a
    # KeyboardInterrupt in the middle of the executor's cleanup.
    installed = _install_interrupt_handlers(loop, stop)
    try:
        spec = executor.resolve(request)
        listener = live  # paced: a slow reader holds the pipes, never the loop
        # A signal that lands before the task's first step cancels it before it spawns.
        task = asyncio.ensure_future(run_published(executor, spec, publish, listener))
        outcome: BashRunResult | Interrupted
        try:
            outcome = await task
        except asyncio.CancelledError:
            if not received:
                raise
            outcome = Interrupted(received[0])
        if settled is not None:
            settled(outcome)
        return outcome
    finally:
        try:
            await executor.aclose()
        finally:
            _restore_handlers(loop, installed)


def run_config(args: argparse.Namespace, workspace: str) -> tuple[SandboxBashConfig, str | None]:
    """The validated config for `run`, and where its file values came from."""
    # The output is streamed as it comes: no spill file is needed to print it whole.
    extra = {} if args.json else {"max_spill_bytes": 1}
    config, loaded = shared_config(args, workspace, extra)
    if "spawn_helper" not in loaded.values:
        # One command per executor: the helper's start (about 35 ms) costs more than the
        # one fork of this small process it would save. The file may still ask for it.
        config = config.model_copy(update={"spawn_helper": False})
    return config, loaded.source.describe() if loaded.source else None


# An executor built before the call (the warm daemon's spare, `warm/spare.py`): given the
# call's own config, the one made from an equal config, or None (the call makes its own).
ReadyExecutor = Callable[[SandboxBashConfig], "SandboxBashExecutor | None"]


def _cmd_run(
    args: argparse.Namespace,
    ready: ReadyExecutor | None = None,
    answer: Callable[[int], None] | None = None,
) -> int:
    if not args.command:
        raise CliError(
            "run: no command given (usage: bash-sandbox run [options] -- COMMAND)",
            EXIT_USAGE,
            "USAGE",
        )
    workspace = workspace_dir(args.workspace)
    config, source = run_config(args, workspace)
    root = config.workspace_root or workspace
    _print_notice(root)
    # The workdir is the workspace root unless the config names another one.
    workdir = workspace if args.workspace is not None else (config.cwd or root)
    session = None
    if args.session:
        _refuse_writable_session(args.session, config)
        session = _open_session(args.session)
    live = None if args.json else LiveOutput(sys.stdout, sys.stderr)
    try:
        try:
            executor = (ready(config) if ready is not None else None) or SandboxBashExecutor(config)
        except PolicyError as exc:  # e.g. a protected path that leaves its root
            raise _config_error(exc, source) from None
        except SandboxUnavailableError as exc:
            # Nothing is probed at construction: only the roots can leave the executor no
            # place for its state (every candidate lies inside a writable root).
            raise CliError(f"config error: {exc.detail}", EXIT_USAGE, "CONFIG_INVALID") from None
        mode = executor.policy_service.resolve_mode(session, args.mode)
        request = BashExecRequest(
            command=command_text(args.command),
            workdir=workdir,
            sandbox_mode=mode,
            stdin=_read_stdin() if args.stdin else None,
        )
        reported: list[int] = []

        def report_now(outcome: BashRunResult | Interrupted) -> None:
            # Written, and the caller answered, before the executor gives its resources
            # back: nothing of the command runs any more.
            reported.append(_report(args, outcome, live))
            if answer is not None:
                answer(reported[0])

        try:
            outcome = asyncio.run(
                run_until_interrupted(
                    executor,
                    request,
                    live,
                    getattr(args, "publish", ()),
                    settled=report_now if answer is not None else None,
                )
            )
        except SandboxUnavailableError as exc:
            # If a cached probe verdict led here, the next run probes for real.
            executor.selector.distrust_cached()
            raise CliError(str(exc), EXIT_UNAVAILABLE, exc.code) from None
        except PolicyError as exc:
            raise CliError(str(exc), EXIT_USAGE, exc.code) from None
        except (WorkdirError, InvalidRequestError) as exc:
            raise CliError(str(exc), EXIT_USAGE, exc.code) from None
        except BashExecError as exc:  # no bash, or the spawn itself failed
            raise CliError(str(exc), EXIT_CANNOT_START, exc.code) from None
        except PublishError as exc:
            raise CliError(str(exc), EXIT_CANNOT_START, exc.code) from None
    finally:
        if session is not None:
            session.close()
    return reported[0] if reported else _report(args, outcome, live)


def _report(
    args: argparse.Namespace, outcome: BashRunResult | Interrupted, live: LiveOutput | None
) -> int:
    """Write ``outcome`` as `run` reports it; its exit status."""
    if isinstance(outcome, Interrupted):
        status = 128 + outcome.signum
        if outcome.signum == signal.SIGPIPE:
            _silence_stdout()  # nobody reads it any more; a shell would print nothing either
            return status
        if live is not None:
            live.finish()
        name = signal.Signals(outcome.signum).name
        error = CliError(f"{name}: the command's process group was killed", status, "INTERRUPTED")
        _print_error(args, error, live, {"signal": name})
        return status
    return report_result(
        outcome, as_json=args.json, stdout=sys.stdout, stderr=sys.stderr, live=live
    )


# -- mode ----------------------------------------------------------------------------------


def _cmd_mode(args: argparse.Namespace) -> int:
    if args.mode is not None:
        with _open_session(args.session) as session:
            new_mode = set_sandbox_mode(session, args.mode)
        print(new_mode.value)
        return 0
    workspace = workspace_dir(args.workspace)
    config = build_config(load_config(args.config, workspace), {"workspace_root": workspace})
    _print_notice(workspace)
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

    loaded = load_config(args.config, workspace_dir(None))
    config = build_config(loaded, {})
    source = (
        f"config: {loaded.source.describe()}"
        if loaded.source is not None
        else f"config: none (defaults); the user config would be {user_config_path()}"
    )
    trust = (
        "a workspace's own pyproject.toml is never read for configuration (a confined "
        "command could write it), nor any config file inside a writable root"
    )
    report = collect_report(
        config,
        network=args.network or config.network,
        version=package_version(),
        notes=(source, trust),
    )
    if args.json:
        payload = report.model_dump(mode="json") | {"usable": report.usable}
        sys.stdout.write(json.dumps(json_safe(payload), indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report))
    sys.stdout.flush()
    return 0 if report.usable else 1


# -- entry point ---------------------------------------------------------------------------

HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "mode": _cmd_mode,
    "doctor": _cmd_doctor,
    "audit": _cmd_audit,
    "mcp": _cmd_mcp,
}


def _write_json_error(
    code: str, message: str, exit_code: int, extra: dict[str, str] | None = None
) -> None:
    # A JSON consumer reads stdout only: tell it why there is no result.
    error = {"code": code, "message": message, "exit_code": exit_code} | (extra or {})
    payload = {"error": error, "outcome": "interrupted" if code == "INTERRUPTED" else "error"}
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.write(json.dumps(json_safe(payload), indent=2) + "\n")
        sys.stdout.flush()


def _print_error(
    args: argparse.Namespace,
    error: CliError,
    live: LiveOutput | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    line = f"{PROG}: {error}"
    if live is not None:
        live.write_notes([line])  # on a line of its own after the streamed output
    else:
        # An error may name a path a command made earlier: inert on a terminal too.
        line = one_line(line)
        sys.stderr.write((render_visible(line) if is_terminal(sys.stderr) else line) + "\n")
        sys.stderr.flush()
    if getattr(args, "json", False):
        _write_json_error(error.code, str(error), error.exit_code, extra)


def _silence_stdout() -> None:
    # The interpreter's final flush must not fail again on the dead pipe.
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(
    argv: list[str] | None = None,
    *,
    parser: CliArgumentParser | None = None,
    ready: ReadyExecutor | None = None,
    answer: Callable[[int], None] | None = None,
) -> int:
    """Run the CLI with ``argv`` (default: `sys.argv[1:]`); returns the exit status.
    ``parser``: one `build_parser(package_version)` made earlier (the warm daemon builds it
    once: it reads nothing of the host or the environment); ``ready``: for `run`, an
    executor made ahead of the call for an equal config (the warm daemon's spare);
    ``answer``: for `run`, called with the exit status once the outcome is written, before
    the executor is closed (the warm daemon answers its client then)."""
    if argv is None:
        # The process's own entry point: everything imported by now lives as long as the
        # process, so no collection (the one at exit included) needs to walk it again.
        gc.freeze()
    words = list(sys.argv[1:] if argv is None else argv)
    if parser is None:
        parser = build_parser(package_version)
    try:
        args, extra = parser.parse_known_args(words)
        if extra:
            hint = (
                " (put the command after `--`: bash-sandbox run -- COMMAND)"
                if args.subcommand == "run"
                else ""
            )
            parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    except UsageError as exc:
        sys.stderr.write(f"{exc.usage}{exc.prog}: error: {exc}\n")
        sys.stderr.flush()
        if wants_json(words):
            _write_json_error(exc.code, f"{exc.prog}: {exc}", EXIT_USAGE)
        return EXIT_USAGE
    except SystemExit as exc:  # --help and --version: argparse already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.subcommand == "run":
            return _cmd_run(args, ready, answer)
        return HANDLERS[args.subcommand](args)
    except ConfigError as exc:
        _print_error(args, _config_error(exc))
        return EXIT_USAGE
    except SubcommandMissingError as exc:
        _print_error(args, CliError(str(exc), EXIT_USAGE, exc.code))
        return EXIT_USAGE
    except CliError as exc:
        _print_error(args, exc)
        return exc.exit_code
    except KeyboardInterrupt:
        # A Ctrl-C before the run's own handler was installed: nothing is running yet.
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly.
        _silence_stdout()
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    raise SystemExit(main())
