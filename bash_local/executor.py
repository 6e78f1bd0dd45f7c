"""`LocalBashExecutor`: runs each command unconfined as a fresh `bash -c` in its own session.

It owns the request -> spec -> plan pipeline and the registry of background processes.
A confining subclass overrides hooks only:

- `config_type`: the config class built when no config is passed;
- `_prepare(spec)`: awaited before each spawn (slow one-time work, off the loop);
- `_confine(spec, plan)`: rewrites the `SpawnPlan` before anything spawns (may raise);
- `_after_spawn(spec, plan)` / `_after_settle(spec, plan)`: right after the spawn, and
  once the process has settled (before its facts);
- `_outcome_facts(spec, plan, ...)`: classifies a settled command (foreground: may raise);
- `_spawn_error(spec, plan, exc)`: the error `run()` raises when the spawn itself failed,
  called while the plan's fds are still open (it is released right after);
- `_kill_group(pid, sig)`: how a command's process group is signalled.

Spawning and watching (process.py), output bounds (output.py) and the environment
(environment.py) are shared as they are.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import ValidationError

from bash_local.config import LocalBashConfig
from bash_local.environment import build_command_env, check_env_channels
from bash_local.long_command import fit_exec_limits
from bash_local.output import OutputCollector, OutputListener, SpillDirectory
from bash_local.process import KillReason, LocalBashProcess, SpawnedCommand
from bash_local.spawn import SpawnPlan
from bash_seam import (
    AbortedBeforeStartError,
    BashExecError,
    BashExecRequest,
    BashExecSpec,
    BashExecutor,
    BashProcess,
    BashProcessRead,
    BashRunResult,
    InvalidRequestError,
    SandboxFacts,
    ShellNotFoundError,
    TaskDoneListener,
    WorkdirError,
)

logger = logging.getLogger("bash_local")


class ExecutorClosedError(BashExecError):
    """`run()`/`start()` after `aclose()`: create a new executor for further commands."""

    code = "EXECUTOR_CLOSED"


def check_workdir(workdir: str) -> None:
    """Raise `WorkdirError` (naming it) unless ``workdir`` is an absolute, existing directory."""
    if not os.path.isabs(workdir):
        raise WorkdirError(f"workdir must be an absolute path, got {workdir!r}")
    if not os.path.isdir(workdir):
        raise WorkdirError(f"workdir {workdir!r} does not exist or is not a directory")


class LocalBashExecutor(BashExecutor):
    """Unconfined local execution. Not thread-safe: use it from one event loop.

    Spill files are kept after `aclose()` (callers read them later); they live in one
    private directory per executor under ``config.spill_dir`` (default: the temp dir).
    """

    config_type: ClassVar[type[LocalBashConfig]] = LocalBashConfig

    def __init__(self, config: LocalBashConfig | None = None, **overrides: Any) -> None:
        base = config if config is not None else self.config_type()
        if overrides:
            try:
                base = type(base).model_validate(base.model_dump() | overrides)
            except ValidationError as exc:
                raise InvalidRequestError(f"invalid executor config: {exc}") from exc
        self.config = base
        self._bash: str | None = None
        self._spill_dir = SpillDirectory(base.spill_dir)
        self._ids = itertools.count(1)
        self._processes: dict[str, LocalBashProcess] = {}
        self._live: set[SpawnedCommand] = set()
        self._listeners: dict[int, TaskDoneListener] = {}
        self._listener_ids = itertools.count()
        self._closing = False

    @property
    def spill_directory(self) -> str | None:
        """This executor's private spill directory, once a stream has spilled."""
        return self._spill_dir.path

    # -- request -> spec -------------------------------------------------------------------

    def resolve(self, request: BashExecRequest) -> BashExecSpec:
        """Fill in defaults and caps; reject what could never run. Spawns nothing."""
        cfg = self.config
        try:
            # An empty workdir is not "unset": it is rejected below as relative.
            workdir = request.workdir if request.workdir is not None else cfg.cwd or os.getcwd()
        except FileNotFoundError as exc:
            raise WorkdirError("the current directory no longer exists; pass workdir") from exc
        check_workdir(workdir)
        check_env_channels(request.env, request.dsh_env)
        try:
            return BashExecSpec(
                command=request.command,
                workdir=workdir,
                timeout_ms=min(request.timeout_ms or cfg.timeout_ms, cfg.max_timeout_ms),
                stdout_max_bytes=request.stdout_max_bytes or cfg.max_output_bytes,
                owner=request.owner,
                sandbox_policy=None,
                signal=request.signal,
                stdin=request.stdin,
                env=request.env,
                dsh_env=request.dsh_env,
            )
        except ValidationError as exc:
            raise InvalidRequestError(f"invalid request: {exc}") from exc

    # -- hooks for confining subclasses ----------------------------------------------------

    def _bash_path(self) -> str:
        """Absolute path of bash, looked up once; nothing is searched on PATH at spawn."""
        if self._bash is None:
            found = shutil.which("bash")
            if found is None:
                raise ShellNotFoundError("bash was not found on PATH: install bash")
            self._bash = os.path.abspath(found)
        return self._bash

    def _build_spawn_plan(self, spec: BashExecSpec) -> SpawnPlan:
        """Base plan: (bash_abs, "-c", spec.command), the built env, spec.workdir; then returns
        self._confine(spec, plan)."""
        plan = SpawnPlan(
            argv=(self._bash_path(), "-c", spec.command),
            env=build_command_env(os.environ, spec.env, spec.dsh_env),
            cwd=spec.workdir,
        )
        # Before confining: a command over one exec argument goes through a memfd; what
        # still cannot be exec'd is a request error (E2BIG), not a spawn failure.
        plan = fit_exec_limits(plan)
        return self._confine(spec, plan)

    def _confine(self, spec: BashExecSpec, plan: SpawnPlan) -> SpawnPlan:
        """Rewrite the plan to confine it; may raise (nothing has spawned yet)."""
        return plan

    def _after_spawn(self, spec: BashExecSpec, plan: SpawnPlan) -> None:
        """Right after a successful spawn, on the loop thread (may raise: the command is
        killed and the error propagates)."""

    def _after_settle(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str,
    ) -> None:
        """Once per spawn, when the process has settled, before its facts are read; runs
        even when the task awaiting `run()` was cancelled."""

    def _outcome_facts(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str,
        background: bool,
        stdout_text: str = "",
    ) -> SandboxFacts | None:
        """What confinement did for a settled command; None from an unconfined executor.
        ``stdout_text``/``stderr_text`` are the bounded tails the result carries."""
        return None

    def _spawn_error(self, spec: BashExecSpec, plan: SpawnPlan, exc: BaseException) -> Exception:
        """The error `run()` raises when the spawn itself failed (nothing is running)."""
        if isinstance(exc, OSError) and exc.filename == plan.cwd:
            return WorkdirError(f"workdir {plan.cwd!r} is unusable: {exc.strerror}")
        if isinstance(exc, FileNotFoundError) and exc.filename == plan.argv[0]:
            return ShellNotFoundError(f"{plan.argv[0]} could not be executed: {exc.strerror}")
        return BashExecError(f"could not spawn {plan.argv[0]}: {exc}")

    def _kill_group(self, pid: int, sig: int) -> None:
        """Signal the process group of a spawned command (start_new_session: pgid == pid)."""
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass  # the group is already empty
        except PermissionError as exc:  # e.g. macOS, for a group holding only a zombie
            logger.debug("killpg(%d, %d) refused: %s", pid, sig, exc)

    # -- foreground ------------------------------------------------------------------------

    async def _prepare(self, spec: BashExecSpec) -> None:
        """Slow one-time work before a spawn (probes, namespaces), run off the event loop by
        confining subclasses; the spawn itself stays on the loop thread (see `spawn()`)."""

    async def run(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashRunResult:
        """Run ``spec`` to completion. ``on_output`` sees every chunk as it is written (a
        CLI streams with it); the result still carries the bounded output."""
        timeout_ms = min(spec.timeout_ms, self.config.max_timeout_ms)
        await self._prepare(spec)
        spawned, _ = self._launch(spec, background=False, on_output=on_output)
        spawned.arm_timeout(timeout_ms / 1000)
        try:
            await spawned.settled.wait()
        except BaseException:
            # Cancelled (or torn down) while the command runs: the group dies before the
            # error propagates; the watcher still reaps and releases in the background.
            spawned.kill_now()
            raise
        stdout, stderr = spawned.stdout.collected(), spawned.stderr.collected()
        # May raise (e.g. SandboxUnavailableError): the run has fully settled by now.
        facts = self._outcome_facts(
            spec,
            spawned.plan,
            exit_code=spawned.exit_code,
            signal=spawned.signal,
            stderr_text=stderr.text,
            background=False,
            stdout_text=stdout.text,
        )
        return BashRunResult(
            exit_code=spawned.exit_code,
            signal=spawned.signal,
            timed_out=spawned.kill_reason == "timeout",
            aborted=spawned.kill_reason == "abort",
            timeout_ms=timeout_ms,
            stdout=stdout,
            stderr=stderr,
            sandbox=facts,
        )

    # -- background ------------------------------------------------------------------------

    async def start(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashProcess:
        await self._prepare(spec)
        try:
            _, process = self._launch(spec, background=True, on_output=on_output)
        except _SpawnFailed as failed:
            # Reported like a process that never got to run: killed, the reason on stderr.
            message = f"bash-local: {failed.error}\n"
            stdout, stderr = self._collectors(spec)
            stderr.feed(message.encode())
            stdout.close()
            stderr.close()
            process = LocalBashProcess(failed.process_id, spec.command, spec.owner, stdout, stderr)
            self._processes[process.id] = process
            facts = self._background_facts(
                spec, failed.plan, exit_code=None, signal=None, stderr_text=message
            )
            process.settle("killed", exit_code=None, signal=None, sandbox=facts)
            # Like every other process, it is reported after start() has returned it.
            asyncio.get_running_loop().call_soon(self._fire_task_done, process)
            return process
        assert process is not None
        return process

    def get(self, process_id: str) -> BashProcess:
        return self._processes[process_id]

    def list(self) -> list[BashProcess]:
        return list(self._processes.values())

    def owner_of(self, process_id: str) -> str | None:
        return self._processes[process_id].owner

    def read_output(self, process_id: str) -> BashProcessRead:
        return self._processes[process_id].read_output()

    def kill(self, process_id: str) -> bool:
        return self._processes[process_id].kill()

    def on_task_done(self, listener: TaskDoneListener) -> Callable[[], None]:
        token = next(self._listener_ids)
        self._listeners[token] = listener

        def dispose() -> None:
            self._listeners.pop(token, None)

        return dispose

    async def aclose(self) -> None:
        """Kill every live process group (SIGTERM, SIGKILL after grace) and wait for them."""
        self._closing = True  # from here on no listener fires and nothing new spawns
        live = list(self._live)
        for spawned in live:
            spawned.terminate("close")
        for spawned in live:
            await spawned.settled.wait()
        for process in list(self._processes.values()):
            await process.wait()
        self._spill_dir.remove_if_empty()

    # -- spawning --------------------------------------------------------------------------

    def _collectors(
        self, spec: BashExecSpec, listener: OutputListener | None = None
    ) -> tuple[OutputCollector, OutputCollector]:
        def collector(stream: str) -> OutputCollector:
            return OutputCollector(
                spec.stdout_max_bytes,
                stream=stream,
                spill_dir=self._spill_dir,
                max_spill_bytes=self.config.max_spill_bytes,
                listener=listener,
            )

        return collector("stdout"), collector("stderr")

    def _launch(
        self,
        spec: BashExecSpec,
        *,
        background: bool,
        on_output: OutputListener | None = None,
    ) -> tuple[SpawnedCommand, LocalBashProcess | None]:
        """Validate, plan and spawn. Raises before spawning for every infrastructure error;
        a background spawn that fails raises `_SpawnFailed` (it still gets an id)."""
        if self._closing:
            raise ExecutorClosedError("the executor is closed; create a new one")
        if spec.signal is not None and spec.signal.aborted:
            raise AbortedBeforeStartError("the request was aborted before it started")
        check_workdir(spec.workdir)
        plan = self._build_spawn_plan(spec)
        stdin = spec.stdin.encode() if isinstance(spec.stdin, str) else spec.stdin
        stdout, stderr = self._collectors(spec, on_output)
        process: LocalBashProcess | None = None
        if background:
            # Ids are taken only once the spec proved runnable: no gaps for rejected specs.
            process_id = f"bash-{next(self._ids)}"
            process = LocalBashProcess(process_id, spec.command, spec.owner, stdout, stderr)
        spawned = SpawnedCommand(
            plan,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            grace_s=self.config.grace_ms / 1000,
            kill_group=self._kill_group,
            on_settled=lambda done: self._on_settled(done, spec, process),
        )
        try:
            spawned.spawn()
        except BaseException as exc:
            try:
                if not isinstance(exc, OSError | subprocess.SubprocessError):
                    raise
                # Before the release: the plan's fds may still explain the failure.
                error = self._spawn_error(spec, plan, exc)
            finally:
                spawned.abandon()
            if process is not None:
                raise _SpawnFailed(process.id, plan, error) from exc
            raise error from exc
        try:
            self._after_spawn(spec, plan)
        except BaseException:
            # The command runs but cannot be watched as the subclass needs: it dies now.
            spawned.kill_now()
            raise
        # Held until settled, so aclose() can find it even if the awaiting task is gone.
        self._live.add(spawned)
        if process is not None:
            process.attach(spawned)
            self._processes[process.id] = process
        if spec.signal is not None:
            spawned.watch_abort(spec.signal)
        return spawned, process

    def _on_settled(
        self, spawned: SpawnedCommand, spec: BashExecSpec, process: LocalBashProcess | None
    ) -> None:
        self._live.discard(spawned)
        try:
            self._after_settle(
                spec,
                spawned.plan,
                exit_code=spawned.exit_code,
                signal=spawned.signal,
                stderr_text=spawned.stderr.collected().text,
            )
        except Exception:
            logger.exception("finishing the settled spawn %d failed", spawned.pid)
        if process is None:
            return
        reason: KillReason | None = spawned.kill_reason
        facts = self._background_facts(
            spec,
            spawned.plan,
            exit_code=spawned.exit_code,
            signal=spawned.signal,
            stderr_text=spawned.stderr.collected().text,
            stdout_text=spawned.stdout.collected().text,
        )
        process.settle(
            "completed" if reason is None else "killed",
            exit_code=spawned.exit_code,
            signal=spawned.signal,
            sandbox=facts,
        )
        self._fire_task_done(process)

    def _background_facts(
        self,
        spec: BashExecSpec,
        plan: SpawnPlan,
        *,
        exit_code: int | None,
        signal: str | None,
        stderr_text: str,
        stdout_text: str = "",
    ) -> SandboxFacts | None:
        try:
            return self._outcome_facts(
                spec,
                plan,
                exit_code=exit_code,
                signal=signal,
                stderr_text=stderr_text,
                background=True,
                stdout_text=stdout_text,
            )
        except Exception:
            logger.exception("classifying the outcome of a background command failed")
            return None

    def _fire_task_done(self, process: LocalBashProcess) -> None:
        if self._closing:
            return
        for listener in list(self._listeners.values()):
            try:
                listener(process)
            except Exception:
                logger.exception("on_task_done listener failed for %s", process.id)


class _SpawnFailed(Exception):
    """Internal: a background spawn failed; `start()` turns it into a killed process."""

    def __init__(self, process_id: str, plan: SpawnPlan, error: BaseException) -> None:
        super().__init__(str(error))
        self.process_id = process_id
        self.plan = plan
        self.error = error
