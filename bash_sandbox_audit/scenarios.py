"""Drives for attacks that need more than one confined run: the host acting in between.

* `steps` runs a list of `Step`s in order: confined commands (`confined`), real CLI calls in
  a subprocess (`cli`, optionally with a pseudo-terminal as its stdout) and host-side actions
  (`host`, e.g. the user's own `git commit` that a planted file would hijack).
* `in_own_process` runs commands on an executor made in a helper process whose environment
  is the premise (a venv on `PATH`, `TMPDIR` inside the workspace, credentials).
* `while_running` starts a command and lets the host act (rename a protected file, create a
  denied one) while it runs, waiting after each act until the command tried again.
* `serve_then_connect` starts a server command and reaches it from a later `run()`.

Like every drive they record what happened in the `Outcome` and never judge it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import termios
import tty
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.executor import SandboxBashExecutor
from bash_sandbox_audit.drives import executor_config, spawn_helper
from bash_sandbox_audit.model import TOKEN_VARIABLE, AttackEnv, AttackSetup, Outcome
from bash_sandbox_audit.programs import program_text
from bash_sandbox_audit.targets import poll_until
from bash_seam import BashExecError, BashProcess, BashRunResult

Step = Callable[[AttackEnv, AttackSetup, Outcome], Awaitable[None]]
HostAction = Callable[[AttackEnv, Outcome], object]
CLI_TIMEOUT_S = 40


async def steps(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run ``setup.data["steps"]`` in order; an infrastructure error stops the sequence."""
    outcome = Outcome()
    try:
        for step in setup.data["steps"]:
            await step(env, setup, outcome)
    except (SandboxUnavailableError, BashExecError) as exc:
        outcome.error = exc
    return outcome


def confined(command: str, *, executor: str = "main", **overrides: Any) -> Step:
    """Run ``command`` (already rendered) confined; steps naming the same ``executor``
    share one executor, so its state carries over from one command to the next."""

    async def step(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> None:
        made: dict[str, SandboxBashExecutor] = outcome.notes.setdefault("executors", {})
        ex = made.get(executor)
        if ex is None:
            ex = made[executor] = env.executor(**{**setup.executor_kwargs, **overrides})
        result = await ex.run(ex.resolve(env.request(command, timeout_ms=setup.timeout_ms)))
        outcome.results.append(result)
        outcome.result = result

    return step


def host(action: HostAction) -> Step:
    """A host-side action (outside every sandbox), e.g. the user running git afterwards."""

    async def step(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> None:
        await asyncio.to_thread(action, env, outcome)

    return step


def cli_env(env: AttackEnv) -> dict[str, str]:
    """The environment of a CLI call: the audit's own, a private TMPDIR, the run token."""
    tmpdir = env.path("cli-tmp")
    os.makedirs(tmpdir, exist_ok=True)
    return {**os.environ, "TMPDIR": tmpdir, TOKEN_VARIABLE: env.token}


def _run_on_pty(argv: list[str], child_env: dict[str, str], cwd: str) -> tuple[int, bytes, str]:
    """Run ``argv`` with stdout and stderr on a fresh pseudo-terminal; returns the exit
    status and every byte the terminal received."""
    master, slave = os.openpty()
    try:
        # Raw: the line discipline must not add or translate bytes (no \n -> \r\n).
        tty.setraw(slave, termios.TCSANOW)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            env=child_env,
            cwd=cwd,
            start_new_session=True,  # a new session without a controlling terminal
        )
    finally:
        os.close(slave)
    received = bytearray()
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            received += chunk
        rc = proc.wait(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    finally:
        os.close(master)
    return rc, bytes(received), ""


def cli(*args: str, on_pty: bool = False) -> Step:
    """Call the real `bash-sandbox` CLI (``python -m bash_sandbox.cli ARGS``) in a subprocess.

    Records ``{"args", "rc", "stdout" (bytes), "stderr"}`` in ``notes["cli"]``; the output
    is also part of what the host saw (`Outcome.texts`)."""

    async def step(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> None:
        argv = [sys.executable, "-m", "bash_sandbox.cli", *args]
        child_env = cli_env(env)
        if on_pty:
            rc, out, err = await asyncio.to_thread(_run_on_pty, argv, child_env, env.root)
        else:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=child_env,
                cwd=env.root,
                start_new_session=True,
            )
            try:
                out, err_bytes = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                out, err_bytes = await proc.communicate()
            rc = proc.returncode if proc.returncode is not None else -1
            err = err_bytes.decode(errors="replace")
        # A traceback is the CLI failing, not refusing: nothing is proven then.
        crashed = b"Traceback (most recent call last)" in out or "Traceback (most" in err
        outcome.notes.setdefault("cli", []).append(
            {"args": list(args), "rc": rc, "stdout": out, "stderr": err, "crashed": crashed}
        )
        outcome.texts.append(out.decode(errors="replace") + err)

    return step


# -- an executor made in a process of its own ------------------------------------------------


async def in_own_process(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run ``data["commands"]`` on one executor in a helper process whose environment is
    the audit's with ``data["process_env"]`` laid over it.

    Results land in ``outcome.results`` (the last one in ``outcome.result``); an exception
    the executor raised is recorded as ``notes["raised"]`` ("Type: message")."""
    outcome = Outcome()
    config = {
        "kind": setup.data.get("kind", "sandbox"),
        "executor": executor_config(env, setup),
        "commands": list(setup.data["commands"]),
        "env": {TOKEN_VARIABLE: env.token, **setup.data.get("request_env", {})},
        "timeout_ms": setup.timeout_ms,
    }
    helper = await spawn_helper(
        env, program_text("executor_session.py"), config, setup.data.get("process_env", {})
    )
    try:
        stdout, stderr = await asyncio.wait_for(helper.communicate(), 60)
    except TimeoutError:
        outcome.notes["helper_output"] = "the executor's helper process timed out"
        return outcome
    outcome.notes["helper_stderr"] = stderr.decode(errors="replace")[-2000:]
    raised: list[str] = []
    for line in stdout.decode(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if "result" in item:
            outcome.result = BashRunResult.model_validate(item["result"])
            outcome.results.append(outcome.result)
        elif "error" in item:
            raised.append(str(item["error"]))
    if raised:
        outcome.notes["raised"] = raised
    return outcome


# -- the host acts while a command runs ------------------------------------------------------


class _Reader:
    """Everything a background command printed so far (`read_output` consumes)."""

    def __init__(self, proc: BashProcess) -> None:
        self.proc = proc
        self.text = ""

    def update(self) -> str:
        self.text += self.proc.read_output().delta
        return self.text

    def running(self) -> bool:
        return self.proc.status == "running"

    def tried(self, times: int) -> bool:
        """The command printed ``times`` TRY lines in all, or it is gone."""
        return self.update().count("TRY") >= times or not self.running()


@contextlib.asynccontextmanager
async def _started(
    env: AttackEnv, setup: AttackSetup, outcome: Outcome
) -> AsyncIterator[_Reader | None]:
    """`start()` the setup's command on a fresh executor; afterwards kill it, wait for it
    and keep what it printed and its facts. A refusal to start becomes ``outcome.error``
    and yields None."""
    ex = env.executor(**setup.executor_kwargs)
    try:
        proc = await ex.start(ex.resolve(env.request(setup.command, timeout_ms=setup.timeout_ms)))
    except (SandboxUnavailableError, BashExecError) as exc:
        outcome.error = exc
        yield None
        return
    reader = _Reader(proc)
    try:
        yield reader
    finally:
        proc.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 15)
        outcome.texts.append(reader.update())
        outcome.notes["facts"] = proc.sandbox
        outcome.notes["status"] = proc.status


async def while_running(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """`start()` the command; once it prints ``READY``, do each host act of
    ``data["acts"]`` and after each wait until the command printed ``data["tries"]`` more
    ``TRY`` lines (it tried again against what the host just did); then kill it. An act
    that sets ``notes["stop_acts"]`` ends the sequence early."""
    outcome = Outcome()
    tries: int = setup.data.get("tries", 3)
    acts: list[HostAction] = setup.data["acts"]
    async with _started(env, setup, outcome) as reader:
        if reader is None:
            return outcome
        ready = await poll_until(lambda: "READY" in reader.update() or not reader.running(), 15)
        outcome.notes["ready"] = ready and "READY" in reader.text
        for act in acts if outcome.notes["ready"] else []:
            wanted = reader.update().count("TRY") + tries
            await asyncio.to_thread(act, env, outcome)
            if outcome.notes.get("stop_acts"):  # an act saw the attack succeed: proven
                break
            await poll_until(
                functools.partial(reader.tried, wanted), setup.data.get("act_timeout_s", 5)
            )
    return outcome


async def serve_then_connect(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """`start()` the server command (it prints ``SERVING`` once it listens), then `run()`
    ``data["client"]`` on the same executor; the server is killed afterwards."""
    outcome = Outcome()
    async with _started(env, setup, outcome) as reader:
        if reader is None:
            return outcome
        await poll_until(lambda: "SERVING" in reader.update() or not reader.running(), 15)
        if "SERVING" in reader.text:
            ex = env.executors[-1]
            try:
                outcome.result = await ex.run(ex.resolve(env.request(setup.data["client"])))
                outcome.results.append(outcome.result)
            except (SandboxUnavailableError, BashExecError) as exc:
                outcome.error = exc
    return outcome
