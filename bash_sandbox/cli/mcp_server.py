"""`bash-sandbox mcp`: a confined bash tool server over MCP stdio.

One `SandboxBashExecutor` lives as long as the server, so every call shares its private
/tmp, tool caches and isolated loopback: a server started by `bash_start` is reachable from
the next `bash_run`. The configuration is the CLI's own (`config_file.load_config` /
`build_config`), so `bash-sandbox run` and this server confine alike.

Lifetime: every background command dies with the server. However serving ends (the client
closes stdin, or SIGTERM/SIGINT/SIGHUP), `executor.aclose()` runs before the process exits.
Only protocol messages reach stdout: the SDK's `stdio_server` serves the wire from a private
copy of fd 1 and points fd 1 at stderr, and commands only ever write into their own pipes.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from bash_sandbox.cli.exit_codes import EXIT_USAGE, CliError
from bash_sandbox.cli.mcp_approval import Approval, ApprovalDesk, question_text
from bash_sandbox.cli.mcp_escalation import (
    Escalation,
    EscalationCeiling,
    EscalationError,
    check_session_log_location,
    judge_escalation,
)
from bash_sandbox.cli.mcp_results import (
    error_result,
    kill_result,
    list_result,
    read_result,
    run_result,
    start_result,
)
from bash_sandbox.cli.mcp_tools import (
    ARGUMENT_MODELS,
    BASH_KILL,
    BASH_LIST,
    BASH_READ,
    BashRunArguments,
    BashStartArguments,
    ProcessArguments,
    tool_definitions,
)
from bash_sandbox.cli.mcp_wire import AnsweringReadStream
from bash_sandbox.cli.settings import package_version, shared_config, workspace_dir
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.executor import SandboxBashExecutor
from bash_sandbox.publish import PublishError
from bash_seam import BashExecError, BashExecRequest, BashExecSpec
from policies import (
    JsonlSessionLog,
    NetworkMode,
    PolicyError,
    SandboxMode,
    set_sandbox_mode,
)

_EnumT = TypeVar("_EnumT", SandboxMode, NetworkMode)

SERVER_NAME = "bash-sandbox"
logger = logging.getLogger("bash_sandbox.mcp")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# An unanswered approval question (2026-07-28 round trip) is void after this long.
APPROVAL_TTL_S = 600.0
# Extra time, past the executor's own SIGTERM->SIGKILL grace, that bash_kill waits.
KILL_WAIT_SLACK_S = 5.0


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server was started with, validated."""

    config: SandboxBashConfig
    workspace: str
    default_workdir: str
    ceiling: EscalationCeiling
    session_path: str | None


def build_settings(args: argparse.Namespace) -> ServerSettings:
    """The validated settings for ``args``; raises `CliError` / `ConfigError` (nothing runs)."""
    workspace = workspace_dir(args.workspace)
    # `--mode` is the default of every call here (in `run` it is the one command's).
    config, _ = shared_config(args, workspace, {"mode": args.mode} if args.mode else None)
    root = config.workspace_root or workspace
    ceiling = EscalationCeiling(
        mode=SandboxMode(args.allow_escalation_to) if args.allow_escalation_to else None,
        network=NetworkMode.HOST if args.allow_network_escalation else NetworkMode.ISOLATED,
    )
    session_path: str | None = None
    if args.session is not None:
        try:
            session_path = check_session_log_location(args.session, [root, *config.writable_roots])
        except EscalationError as exc:
            raise CliError(str(exc), EXIT_USAGE, exc.code) from None
        try:
            JsonlSessionLog(session_path).close()
        except OSError as exc:
            raise CliError(
                f"cannot open session log {args.session}: {exc.strerror or exc}",
                EXIT_USAGE,
                "SESSION_UNREADABLE",
            ) from None
    default_workdir = workspace if args.workspace is not None else (config.cwd or workspace)
    return ServerSettings(config, root, default_workdir, ceiling, session_path)


class _CallRefused(Exception):
    """A tool call that ends in a tool error; nothing ran."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _escalation_field(
    name: str, value: str | None, kind: type[_EnumT], *, offered: bool, why_not: str
) -> _EnumT | None:
    """A per-call `sandbox_mode` / `network`: refused unless the server offers it."""
    if value is None:
        return None
    if not offered:
        raise _CallRefused(
            "INVALID_ARGUMENTS", f"{name} is not accepted: this server was started {why_not}"
        )
    try:
        return kind(value)
    except ValueError as exc:
        raise _CallRefused("INVALID_ARGUMENTS", f"{name}: {exc}") from None


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class BashToolServer:
    """The tools over one long-lived executor; each call is judged, maybe approved, then run."""

    def __init__(self, settings: ServerSettings, executor: SandboxBashExecutor) -> None:
        self._settings = settings
        self._executor = executor
        self._desk = ApprovalDesk(can_remember=settings.session_path is not None)

    # -- mode and network in force --------------------------------------------------------

    def current_mode(self) -> SandboxMode:
        """The session log's override, else the configured default; read anew each call so
        a `bash-sandbox mode --session FILE` from elsewhere takes effect at once."""
        service = self._executor.policy_service
        if self._settings.session_path is None:
            return service.resolve_mode()
        try:
            with JsonlSessionLog(self._settings.session_path) as session:
                return service.resolve_mode(session)
        except OSError as exc:
            # Never guess a mode: without the log nothing runs.
            raise _CallRefused(
                "SESSION_UNREADABLE",
                f"cannot read the session log {self._settings.session_path}: "
                f"{exc.strerror or exc}; ask the user to fix it",
            ) from None

    @property
    def network(self) -> NetworkMode:
        return self._settings.config.network

    def remember_mode(self, mode: SandboxMode) -> None:
        assert self._settings.session_path is not None
        with JsonlSessionLog(self._settings.session_path) as session:
            set_sandbox_mode(session, mode)
        logger.info("session override recorded: %s (in %s)", mode.value, session.path)

    # -- MCP handlers ---------------------------------------------------------------------

    def tools(self) -> list[types.Tool]:
        return tool_definitions(self._settings.ceiling, self.current_mode(), self.network)

    async def on_list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools())

    async def on_call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        model = ARGUMENT_MODELS.get(params.name)
        if model is None:
            known = ", ".join(ARGUMENT_MODELS)
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"Unknown tool {params.name!r}; tools: {known}"
            )
        try:
            arguments = model.model_validate(params.arguments or {})
        except ValidationError as exc:
            return error_result("INVALID_ARGUMENTS", _describe_validation(exc))
        try:
            if isinstance(arguments, BashRunArguments | BashStartArguments):
                return await self._run_or_start(ctx, params, arguments)
            if params.name == BASH_LIST:
                return list_result(self._executor.list())
            assert isinstance(arguments, ProcessArguments)
            return await self._process_call(params.name, arguments.id)
        except _CallRefused as exc:
            return error_result(exc.code, str(exc))
        except EscalationError as exc:
            return error_result(exc.code, str(exc))
        except SandboxUnavailableError as exc:
            return error_result(exc.code, str(exc))
        except (BashExecError, PolicyError) as exc:
            return error_result(exc.code, str(exc))

    # -- bash_run / bash_start --------------------------------------------------------------

    def _escalation(self, arguments: BashRunArguments | BashStartArguments) -> Escalation:
        current = self.current_mode()
        ceiling = self._settings.ceiling
        requested_mode = _escalation_field(
            "sandbox_mode",
            arguments.sandbox_mode,
            SandboxMode,
            offered=ceiling.offers_mode(current),
            why_not=f"without a wider --allow-escalation-to, so every call runs under "
            f"{current.value}",
        )
        requested_network = _escalation_field(
            "network",
            arguments.network,
            NetworkMode,
            offered=ceiling.offers_network(self.network),
            why_not=f"without --allow-network-escalation, so every call runs with "
            f"{self.network.value}",
        )
        return judge_escalation(
            ceiling,
            current_mode=current,
            current_network=self.network,
            requested_mode=requested_mode,
            requested_network=requested_network,
        )

    def _workdir(self, workdir: str | None) -> str:
        if workdir is None:
            return self._settings.default_workdir
        # A relative workdir from the model starts at the workspace root.
        return os.path.join(self._settings.workspace, workdir)

    def _spec(self, request: BashExecRequest, escalation: Escalation) -> BashExecSpec:
        spec = self._executor.resolve(request)
        policy = spec.sandbox_policy
        if policy is not None and policy.network is not escalation.network:
            policy = policy.model_copy(update={"network": escalation.network})
            spec = spec.model_copy(update={"sandbox_policy": policy})
        return spec

    async def _run_or_start(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        arguments: BashRunArguments | BashStartArguments,
    ) -> types.CallToolResult | types.InputRequiredResult:
        escalation = self._escalation(arguments)
        workdir = self._workdir(arguments.workdir)
        if escalation.needs_approval:
            question = question_text(
                escalation,
                command=arguments.command,
                workdir=workdir,
                current=f"{self.current_mode().value}, network {self.network.value}",
            )
            answer = await self._desk.ask(ctx, params, escalation, question)
            if isinstance(answer, types.InputRequiredResult):
                return answer
            self._check_approved(answer, escalation)
        try:
            request = BashExecRequest(
                command=arguments.command,
                workdir=workdir,
                timeout_ms=arguments.timeout_ms
                if isinstance(arguments, BashRunArguments)
                else None,
                sandbox_mode=escalation.mode,
            )
        except ValidationError as exc:
            raise _CallRefused("INVALID_ARGUMENTS", _describe_validation(exc)) from None
        spec = self._spec(request, escalation)
        if isinstance(arguments, BashRunArguments):
            result = await self._executor.run(spec)
            return run_result(result, mode=escalation.mode, network=escalation.network)
        try:
            process = await self._executor.start(spec, publish=arguments.publish or ())
        except PublishError as exc:
            raise _CallRefused(exc.code, str(exc)) from None
        return start_result(
            process,
            mode=escalation.mode,
            network=escalation.network,
            published=self._executor.published(process.id),
        )

    def _check_approved(self, answer: Approval, escalation: Escalation) -> None:
        if not answer.approved:
            logger.info("widening to %s refused: %s", escalation.describe(), answer.reason)
            raise _CallRefused(
                "ESCALATION_DECLINED",
                f"{answer.reason}: the call needed {escalation.describe()} and did not run. "
                "Do not retry it wider; continue within the current sandbox or ask the user",
            )
        logger.info("widening to %s approved by the user", escalation.describe())
        if answer.remember:
            self.remember_mode(escalation.mode)

    # -- bash_read / bash_kill ------------------------------------------------------------

    async def _process_call(self, tool: str, process_id: str) -> types.CallToolResult:
        try:
            process = self._executor.get(process_id)
        except KeyError:
            raise _CallRefused(
                "UNKNOWN_PROCESS",
                f"no background command {process_id!r}; bash_list shows the ids",
            ) from None
        if tool == BASH_READ:
            return read_result(process, self._executor.read_output(process_id))
        assert tool == BASH_KILL
        killed = self._executor.kill(process_id)
        # The executor escalates SIGTERM to SIGKILL after its grace: the wait is bounded.
        with anyio.move_on_after(self._settings.config.grace_ms / 1000 + KILL_WAIT_SLACK_S):
            await process.wait()
        return kill_result(process, killed=killed)

    # -- the MCP server -------------------------------------------------------------------

    def instructions(self) -> str:
        ceiling = self._settings.ceiling
        text = (
            f"Confined bash for the workspace {self._settings.workspace}. Commands run under "
            f"sandbox mode {self.current_mode().value} with network {self.network.value}. "
            "A result whose text carries a '[sandbox: ...]' marker after its status line "
            "was refused by the sandbox, not by the program: do not retry it unchanged. The "
            "command's own lines that begin like one are shown escaped ('\\[sandbox')."
        )
        if ceiling.offers_mode(self.current_mode()) or ceiling.offers_network(self.network):
            text += (
                " When a task really needs more, pass sandbox_mode (or network) on that one "
                "call; the user is asked to approve it first."
            )
        return text

    def build(self) -> Server[Any]:
        server: Server[Any] = Server(
            SERVER_NAME,
            version=package_version(),
            instructions=self.instructions(),
            on_list_tools=self.on_list_tools,
            on_call_tool=self.on_call_tool,
        )
        # Seals the 2026-07-28 approval round trip's state and binds it to the call's exact
        # tool and arguments; a forged, altered or expired state is refused.
        server.middleware.append(
            RequestStateBoundary(
                RequestStateSecurity.ephemeral(ttl=APPROVAL_TTL_S), default_audience=SERVER_NAME
            )
        )
        return server


def _log_backend(executor: SandboxBashExecutor) -> None:
    """Probe the backends once, before serving, and say on stderr what confines here."""
    probes = executor.probes()
    usable = [p.backend for p in probes if p.usable]
    if usable:
        logger.info("sandbox backends usable here: %s", ", ".join(usable))
    else:
        details = "; ".join(f"{p.backend}: {p.detail}" for p in probes) or "none for this OS"
        logger.warning(
            "no sandbox backend is usable here (%s): every confined call will fail with "
            "SANDBOX_UNAVAILABLE; run `bash-sandbox doctor`",
            details,
        )


async def _watch_signals(scope: anyio.CancelScope, received: list[int]) -> None:
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async for signum in signals:
            received.append(int(signum))
            scope.cancel()
            return


async def serve(settings: ServerSettings, executor: SandboxBashExecutor) -> int:
    """Serve MCP on stdio until the client leaves or a stop signal; returns the exit status.

    Closes ``executor`` on every path.
    """
    received: list[int] = []

    async def close_executor() -> None:
        with anyio.CancelScope(shield=True):
            await executor.aclose()

    try:
        await anyio.to_thread.run_sync(_log_backend, executor)
        server = BashToolServer(settings, executor).build()
        async with stdio_server() as (read_stream, write_stream):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_watch_signals, tasks.cancel_scope, received)
                # Returns at EOF on stdin (the client went away); in-flight calls are
                # cancelled with the scope, which kills their process groups.
                # Malformed lines are answered here; the SDK would drop them unanswered.
                inbound = AnsweringReadStream(read_stream, write_stream)
                await server.run(inbound, write_stream, server.create_initialization_options())
                tasks.cancel_scope.cancel()
            # Before leaving the stdio context: on a signal, stdin's reader thread may still
            # be blocked in read() and leaving would wait for it.
            await close_executor()
            if received:
                status = 128 + received[0]
                logger.info("stopped by %s", signal.Signals(received[0]).name)
                sys.stderr.flush()
                # Every command is dead and the state dir is gone; the only thing left is a
                # worker thread blocked reading stdin, which nothing can wake: exit now.
                os._exit(status)
    finally:
        await close_executor()  # idempotent: also covers a failure before serving
    return 0


def serve_main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="bash-sandbox mcp: %(levelname)s: %(message)s",
    )
    logger.setLevel(logging.INFO)
    settings = build_settings(args)
    logger.info(
        "serving %s (mode %s, network %s, escalation up to %s%s)",
        settings.workspace,
        settings.config.mode.value,
        settings.config.network.value,
        settings.ceiling.mode.value if settings.ceiling.mode else "none",
        ", host network" if settings.ceiling.network is NetworkMode.HOST else "",
    )
    try:
        executor = SandboxBashExecutor(settings.config)
    except PolicyError as exc:  # e.g. a relative path in writable_roots
        raise CliError(f"config error: {exc}", EXIT_USAGE, exc.code) from None
    return anyio.run(serve, settings, executor)
