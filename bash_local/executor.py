"""`LocalBashExecutor`: runs each command unconfined as a fresh `bash -c` in its own session.

It owns the request -> spec -> plan pipeline and the registry of background processes.
A confining subclass overrides one hook, `_open_scope(spec)`, returning the `SpawnScope`
that owns the spawn (spawn.py): its plan, what happens once it spawned or failed to, the
facts once it settled, and one `close()`. `config_type` names the config class built when
no config is passed; `_kill_group(pid, sig)` is how a group is signalled.

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
from bash_local.spawn import SpawnOutcome, SpawnPlan, SpawnScope, UnconfinedSpawn
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
        self._settling: set[asyncio.Task[None]] = set()
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

    # -- the one hook for confining subclasses --------------------------------------------

    def _bash_path(self) -> str:
        """Absolute path of bash, looked up once; nothing is searched on PATH at spawn."""
        if self._bash is None:
            found = shutil.which("bash")
            if found is None:
                raise ShellNotFoundError("bash was not found on PATH: install bash")
            self._bash = os.path.abspath(found)
        return self._bash

    def _base_plan(self, spec: BashExecSpec) -> SpawnPlan:
        """(bash_abs, "-c", spec.command), the built env, spec.workdir. Its ``release`` (a
        long command's memfd) is the caller's to give back: a scope owns it from here."""
        plan = SpawnPlan(
            argv=(self._bash_path(), "-c", spec.command),
            env=build_command_env(os.environ, spec.env, spec.dsh_env),
            cwd=spec.workdir,
        )
        # A command over one exec argument goes through a memfd; what still cannot be
        # exec'd is a request error (E2BIG), not a spawn failure.
        return fit_exec_limits(plan)

    async def _open_scope(self, spec: BashExecSpec) -> SpawnScope:
        """The scope that owns this spawn (may raise: nothing has spawned yet). A confining
        subclass does its slow one-time work off the loop here and wraps the plan; the
        spawn itself follows on the loop thread without another await."""
        return UnconfinedSpawn(self._base_plan(spec))

    def _kill_group(self, pid: int, sig: int) -> None:
        """Signal the process group of a spawned command (start_new_session: pgid == pid)."""
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass  # the group is already empty
        except PermissionError as exc:  # e.g. macOS, for a group holding only a zombie
            logger.debug("killpg(%d, %d) refused: %s", pid, sig, exc)

    # -- foreground ------------------------------------------------------------------------

    async def run(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashRunResult:
        """Run ``spec`` to completion. ``on_output`` sees every chunk as it is written (a
        CLI streams with it); the result still carries the bounded output."""
        timeout_ms = min(spec.timeout_ms, self.config.max_timeout_ms)
        spawned, _ = await self._launch(spec, background=False, on_output=on_output)
        spawned.arm_timeout(timeout_ms / 1000)
        try:
            await spawned.finished.wait()
        except BaseException:
            # Cancelled (or torn down) while the command runs: the group dies before the
            # error propagates; the watcher still settles and closes the scope meanwhile.
            spawned.kill_now()
            raise
        if spawned.facts_error is not None:
            if self._closing and not isinstance(spawned.facts_error, ExecutorClosedError):
                # Spawned while `aclose()` ran, then settled on what it had taken away (a
                # confining executor's settle threads): the close, not the host, is the cause.
                raise ExecutorClosedError("the executor was closed meanwhile") from (
                    spawned.facts_error
                )
            # E.g. SandboxUnavailableError: the run has fully settled by now.
            raise spawned.facts_error
        return BashRunResult(
            exit_code=spawned.exit_code,
            signal=spawned.signal,
            timed_out=spawned.kill_reason == "timeout",
            aborted=spawned.kill_reason == "abort",
            timeout_ms=timeout_ms,
            stdout=spawned.stdout.collected(),
            stderr=spawned.stderr.collected(),
            sandbox=spawned.facts,
        )

    # -- background ------------------------------------------------------------------------

    async def start(
        self, spec: BashExecSpec, *, on_output: OutputListener | None = None
    ) -> BashProcess:
        try:
            _, process = await self._launch(spec, background=True, on_output=on_output)
        except _SpawnFailed as failed:
            # Reported like a process that never got to run: killed, the reason on stderr.
            never_started = SpawnOutcome(
                None, None, stderr=failed.message, background=True, started=False
            )
            try:
                facts = await self._settle_quietly(failed.scope, never_started)
            finally:
                self._close_quietly(failed.scope)
            stdout, stderr = self._collectors(spec)
            stderr.feed(failed.message.encode())
            stdout.close()
            stderr.close()
            process = LocalBashProcess(failed.process_id, spec.command, spec.owner, stdout, stderr)
            self._processes[process.id] = process
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
            await spawned.finished.wait()
        for process in list(self._processes.values()):
            await process.wait()
        # Scopes still settling (a git import in a thread) finish before anything closes.
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
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

    async def _launch(
        self,
        spec: BashExecSpec,
        *,
        background: bool,
        on_output: OutputListener | None = None,
    ) -> tuple[SpawnedCommand, LocalBashProcess | None]:
        """Validate, open the scope and spawn. Raises before spawning for every infrastructure
        error; a background spawn that fails raises `_SpawnFailed` (it still gets an id)."""
        self._check_launchable(spec)
        try:
            scope = await self._open_scope(spec)
            try:
                # No await from here to the spawn: the scope's view of the host stays current.
                self._check_launchable(spec)
            except BaseException:
                scope.close()
                raise
            return await self._spawn(spec, scope, background=background, on_output=on_output)
        except Exception as exc:
            # `aclose()` ran meanwhile and took what the spawn was being built from (a
            # confining executor's state, its helper): that, not the host, is the cause.
            if self._closing and not isinstance(exc, _SpawnFailed | ExecutorClosedError):
                raise ExecutorClosedError("the executor was closed meanwhile") from exc
            raise

    def _check_launchable(self, spec: BashExecSpec) -> None:
        if self._closing:
            raise ExecutorClosedError("the executor is closed; create a new one")
        if spec.signal is not None and spec.signal.aborted:
            raise AbortedBeforeStartError("the request was aborted before it started")
        check_workdir(spec.workdir)

    async def _spawn(
        self,
        spec: BashExecSpec,
        scope: SpawnScope,
        *,
        background: bool,
        on_output: OutputListener | None,
    ) -> tuple[SpawnedCommand, LocalBashProcess | None]:
        """Spawn the scope's plan. From here the scope is closed exactly once: below when
        the spawn fails, else by the settle callback."""
        plan = scope.plan
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
            on_settled=lambda done: self._on_settled(done, scope, process),
        )
        try:
            if plan.launcher is not None:
                await spawned.spawn_launched(plan.launcher)  # a helper forks: the loop runs on
            else:
                spawned.spawn()
        except BaseException as exc:
            try:
                if not isinstance(exc, OSError | subprocess.SubprocessError):
                    raise
                # Before the close: the plan's fds may still explain the failure.
                error = scope.failed(exc)
            except BaseException:
                scope.close()
                raise
            if process is not None:
                # `start()` settles the never-started scope (its facts) and closes it.
                raise _SpawnFailed(process.id, f"bash-local: {error}\n", scope) from exc
            scope.close()
            raise error from exc
        try:
            scope.spawned(spawned.pid, spawned.kill_now)
        except BaseException:
            # The command runs but cannot be watched as the scope needs: it dies now (and
            # the settle callback still closes the scope).
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
        self, spawned: SpawnedCommand, scope: SpawnScope, process: LocalBashProcess | None
    ) -> None:
        """The group is dead and reaped: the scope settles in a task of its own (it may
        wait on a thread, e.g. a git import), which no cancelled awaiter can cancel."""
        self._live.discard(spawned)
        task = asyncio.get_running_loop().create_task(self._settle(spawned, scope, process))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(
        self, spawned: SpawnedCommand, scope: SpawnScope, process: LocalBashProcess | None
    ) -> None:
        outcome = spawned.outcome(background=process is not None)
        try:
            spawned.facts = await scope.settled(outcome)
        except Exception as exc:
            if process is not None:
                logger.exception("classifying the outcome of a background command failed")
            spawned.facts_error = exc
        finally:
            self._close_quietly(scope)
            spawned.finished.set()
        if process is None:
            return
        reason: KillReason | None = spawned.kill_reason
        process.settle(
            "completed" if reason is None else "killed",
            exit_code=spawned.exit_code,
            signal=spawned.signal,
            sandbox=spawned.facts,
        )
        self._fire_task_done(process)

    @staticmethod
    async def _settle_quietly(scope: SpawnScope, outcome: SpawnOutcome) -> SandboxFacts | None:
        try:
            return await scope.settled(outcome)
        except Exception:
            logger.exception("classifying the outcome of a background command failed")
            return None

    @staticmethod
    def _close_quietly(scope: SpawnScope) -> None:
        try:
            scope.close()
        except Exception:
            logger.exception("closing a settled spawn's scope failed")

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

    def __init__(self, process_id: str, message: str, scope: SpawnScope) -> None:
        super().__init__(message)
        self.process_id = process_id
        self.message = message
        self.scope = scope
