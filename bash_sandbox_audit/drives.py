"""How an attack's command is run: the executor lifecycles the threat model names.

A drive takes the env and the setup and returns an `Outcome`; it never judges it. Besides a
plain foreground `run()`, the drives reproduce each way a run can end (completion, timeout,
abort, cancellation, `kill()`, `aclose()`, the executor being SIGKILLed), and run a few
checks in a helper process: peak memory is measured there so concurrent attacks do not blur
it, and a tampered runner is run inside a copy-on-write view of the host so the project's
own probe cannot leave a file on the real filesystem.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

from bash_local import LocalBashExecutor
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox_audit.model import TOKEN_VARIABLE, AttackEnv, AttackSetup, Drive, Outcome
from bash_sandbox_audit.programs import program_text
from bash_sandbox_audit.targets import TaggedProcess, pid_alive, scan_tagged
from bash_seam import AbortController, BashExecError


async def foreground(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """`run()` to completion (or its own timeout) on a fresh executor."""
    ex = env.executor(**setup.executor_kwargs)
    outcome = Outcome()
    try:
        outcome.result = await ex.run(
            ex.resolve(env.request(setup.command, timeout_ms=setup.timeout_ms))
        )
    except (SandboxUnavailableError, BashExecError) as exc:
        outcome.error = exc
    finally:
        await ex.aclose()
    return outcome


async def background_wait(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """`start()`, `wait()`, then read the output (a tracked background process)."""
    ex = env.executor(**setup.executor_kwargs)
    outcome = Outcome()
    try:
        proc = await ex.start(ex.resolve(env.request(setup.command, timeout_ms=setup.timeout_ms)))
        await asyncio.wait_for(proc.wait(), setup.timeout_ms / 1000 + 10)
        read = proc.read_output()
        outcome.notes.update(
            status=proc.status, exit_code=proc.exit_code, delta=read.delta, facts=proc.sandbox
        )
    except (SandboxUnavailableError, BashExecError) as exc:
        outcome.error = exc
    finally:
        await ex.aclose()
    return outcome


# -- lifetimes: the command plants daemons, the audit ends the run, then looks for them -----


# How long the host looks for a command's daemons: the first spawn of a fresh executor
# probes its backends live, which takes seconds on a loaded 2-core machine.
DAEMONS_UP_S = 30.0


async def _watch_daemons(tag: str, expected: int, timeout_s: float) -> list[TaggedProcess]:
    """Poll the host's /proc until ``expected`` tagged daemons are up (or the deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: dict[int, TaggedProcess] = {}
    while loop.time() < deadline:
        found, pause = await scan_tagged(tag, 0.02)
        for p in found:
            seen.setdefault(p.pid, p)
        if len(seen) >= expected:
            break
        await asyncio.sleep(pause)
    return list(seen.values())


def _note_seen(outcome: Outcome, seen: list[TaggedProcess]) -> None:
    outcome.notes["seen"] = [(p.pid, p.cmdline) for p in seen]


def lifetime(trigger: str) -> Drive:
    """A drive that waits until the command's daemons are visible on the host, then ends the
    run by ``trigger``: exit, timeout, abort, cancel, kill, aclose or background-exit."""

    async def drive(env: AttackEnv, setup: AttackSetup) -> Outcome:
        tag: str = setup.data["tag"]
        expected: int = setup.data["expected"]
        ex = env.executor(**setup.executor_kwargs)
        outcome = Outcome()
        try:
            if trigger in ("kill", "aclose", "background-exit"):
                proc = await ex.start(
                    ex.resolve(env.request(setup.command, timeout_ms=setup.timeout_ms))
                )
                _note_seen(outcome, await _watch_daemons(tag, expected, DAEMONS_UP_S))
                if trigger == "kill":
                    proc.kill()
                    await asyncio.wait_for(proc.wait(), 15)
                elif trigger == "aclose":
                    await asyncio.wait_for(ex.aclose(), 15)
                else:
                    await asyncio.wait_for(proc.wait(), 15)
                outcome.notes["status"] = proc.status
                return outcome
            controller = AbortController()
            task = asyncio.ensure_future(
                ex.run(
                    ex.resolve(
                        env.request(
                            setup.command, timeout_ms=setup.timeout_ms, signal=controller.signal
                        )
                    )
                )
            )
            _note_seen(outcome, await _watch_daemons(tag, expected, DAEMONS_UP_S))
            if trigger == "abort":
                controller.abort("audit")
            elif trigger == "cancel":
                task.cancel()
            try:
                outcome.result = await asyncio.wait_for(task, 20)
            except asyncio.CancelledError:
                if trigger != "cancel":
                    raise
                outcome.notes["cancelled"] = True
            return outcome
        finally:
            await ex.aclose()

    drive.__name__ = f"lifetime_{trigger.replace('-', '_')}"
    return drive


async def spawn_helper(
    env: AttackEnv,
    source: str,
    config: dict[str, Any],
    process_env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """A Python helper process (``source`` run with ``config`` as JSON), killed by pid at
    cleanup; ``process_env`` is laid over the audit's own environment."""
    helper_env = dict(os.environ)
    helper_env["TMPDIR"] = env.path("helper-tmp")
    os.makedirs(helper_env["TMPDIR"], exist_ok=True)
    helper_env.update(process_env or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        source,
        json.dumps(config),
        env=helper_env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )

    def kill() -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)

    env.cleanup.add(kill)
    return proc


def executor_config(env: AttackEnv, setup: AttackSetup) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "backend": env.backend,
        "mode": env.mode.value,
        "workspace_root": env.ws,
        "cwd": env.ws,
        "deny_read": list(env.deny_read),
        "grace_ms": 500,
    }
    cfg.update(setup.executor_kwargs)
    return cfg


async def executor_sigkilled(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """SIGKILL (by pid) a child process that owns the executor while the command runs."""
    outcome = Outcome()
    helper = await spawn_helper(
        env,
        program_text("executor_holder.py"),
        {
            "executor": executor_config(env, setup),
            "command": setup.command,
            "env": {TOKEN_VARIABLE: env.token},
        },
    )
    assert helper.stdout is not None and helper.stderr is not None
    try:
        line = await asyncio.wait_for(helper.stdout.readline(), 20)
        outcome.notes["helper_output"] = line.decode(errors="replace")
        _note_seen(outcome, await _watch_daemons(setup.data["tag"], setup.data["expected"], 8))
    except TimeoutError:
        outcome.notes["helper_output"] = "helper did not start in time"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.pid, signal.SIGKILL)
        await helper.wait()
        outcome.notes["helper_stderr"] = (await helper.stderr.read()).decode(errors="replace")
    return outcome


# -- memory: measured in a child process so concurrent attacks do not blur its peak --------


async def measured(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run (or start + read) in a child process that reports its own peak RSS and the spill."""
    outcome = Outcome()
    helper = await spawn_helper(
        env,
        program_text("measured_run.py"),
        {
            "executor": executor_config(env, setup),
            "command": setup.command,
            "env": {TOKEN_VARIABLE: env.token},
            "timeout_ms": setup.timeout_ms,
            "background": bool(setup.data.get("background")),
        },
    )
    try:
        stdout, stderr = await asyncio.wait_for(helper.communicate(), 60)
    except TimeoutError:
        outcome.notes["helper_output"] = "measured helper timed out"
        return outcome
    outcome.notes["helper_stderr"] = stderr.decode(errors="replace")[-2000:]
    try:
        outcome.notes["measured"] = json.loads(stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        outcome.notes["helper_output"] = stdout.decode(errors="replace")[-2000:]
    return outcome


# -- spill files: a second run tries to read the first run's spill ---------------------------


async def two_runs(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run ``data["first"]`` (which spills), then the setup's command rendered with the spill
    path, in the same executor or, with ``data["fresh_executor"]``, in another one.

    ``data["first_kind"] == "local"`` makes the first executor a `LocalBashExecutor` (the
    second is then always another one); ``data["first_kwargs"]`` configures the first."""
    first_kwargs: dict[str, Any] = dict(setup.data.get("first_kwargs", {}))
    local = setup.data.get("first_kind") == "local"
    first_ex: LocalBashExecutor = (
        LocalBashExecutor(max_output_bytes=1024, cwd=env.ws, **first_kwargs)
        if local
        else env.executor(max_output_bytes=1024, **setup.executor_kwargs, **first_kwargs)
    )
    outcome = Outcome()
    try:
        first = await first_ex.run(first_ex.resolve(env.request(setup.data["first"])))
        outcome.results.append(first)
        spill = first.stdout.spill_path
        outcome.notes["spill_path"] = spill
        if spill is None:
            return outcome
        second_ex = first_ex
        if setup.data.get("fresh_executor") or local:
            second_ex = env.executor(**setup.executor_kwargs)
        command = env.render(
            setup.command,
            {
                "spill": spill,
                "spill_dir": os.path.dirname(spill),
                "spill_parent": os.path.dirname(os.path.dirname(spill)),
            },
        )
        outcome.result = await second_ex.run(second_ex.resolve(env.request(command)))
        outcome.results.append(outcome.result)
        outcome.notes["spill_mode"] = os.stat(spill).st_mode & 0o777
        outcome.notes["spill_dir_mode"] = os.stat(os.path.dirname(spill)).st_mode & 0o777
    finally:
        for ex in env.executors:
            await ex.aclose()
        if local:
            await first_ex.aclose()
    return outcome


# -- runners: a tampered runner runs in a copy-on-write view of the host ----------------------


async def overlay_runner(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run the setup's command through its runner inside a copy-on-write host view."""
    outcome = Outcome()
    config = dict(setup.data["overlay_config"])
    config["executor"] = executor_config(env, setup)
    config["command"] = setup.command
    helper = await spawn_helper(env, program_text("overlay_runner.py"), config)
    try:
        stdout, stderr = await asyncio.wait_for(helper.communicate(), 60)
    except TimeoutError:
        outcome.notes["helper_output"] = "overlay helper timed out"
        return outcome
    outcome.notes["helper_stderr"] = stderr.decode(errors="replace")[-2000:]
    text = stdout.decode(errors="replace").strip()
    try:
        outcome.notes["helper"] = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        outcome.notes["helper_output"] = text[-2000:]
    return outcome


def pid_from_file(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().strip() or "0") or None
    except (OSError, ValueError):
        return None


def kill_pid_file(path: str) -> None:
    """SIGKILL the pid a runner script recorded (if it is still alive)."""
    pid = pid_from_file(path)
    if pid is not None and pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
