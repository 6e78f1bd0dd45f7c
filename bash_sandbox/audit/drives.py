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

from bash_sandbox.audit.model import TOKEN_VARIABLE, AttackEnv, AttackSetup, Drive, Outcome
from bash_sandbox.audit.targets import TaggedProcess, find_tagged, pid_alive
from bash_sandbox.errors import SandboxUnavailableError
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


async def _watch_daemons(tag: str, expected: int, timeout_s: float) -> list[TaggedProcess]:
    """Poll the host's /proc until ``expected`` tagged daemons are up (or the deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: dict[int, TaggedProcess] = {}
    while loop.time() < deadline:
        for p in find_tagged(tag):
            seen.setdefault(p.pid, p)
        if len(seen) >= expected:
            break
        await asyncio.sleep(0.02)
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
                _note_seen(outcome, await _watch_daemons(tag, expected, 8))
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
            _note_seen(outcome, await _watch_daemons(tag, expected, 8))
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


# A child process that owns an executor, starts the daemonising command in the background and
# then idles until the audit SIGKILLs it: nothing of it may survive its executor.
_EXECUTOR_HOLDER = r"""
import asyncio, json, sys
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest
cfg = json.loads(sys.argv[1])
async def main():
    ex = SandboxBashExecutor(**cfg["executor"])
    proc = await ex.start(ex.resolve(BashExecRequest(command=cfg["command"], env=cfg["env"])))
    print("STARTED", proc.id, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


async def _spawn_helper(
    env: AttackEnv,
    source: str,
    config: dict[str, Any],
) -> asyncio.subprocess.Process:
    helper_env = dict(os.environ)
    helper_env["TMPDIR"] = env.path("helper-tmp")
    os.makedirs(helper_env["TMPDIR"], exist_ok=True)
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


def _executor_config(env: AttackEnv, setup: AttackSetup) -> dict[str, Any]:
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
    helper = await _spawn_helper(
        env,
        _EXECUTOR_HOLDER,
        {
            "executor": _executor_config(env, setup),
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

_MEASURED_RUN = r"""
import asyncio, hashlib, json, os, sys
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

def kib(name):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0

def spill_facts(path):
    if not path:
        return None
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    st = os.stat(path)
    parent = os.stat(os.path.dirname(path))
    return {"path": path, "size": size, "sha256": h.hexdigest(), "mode": st.st_mode & 0o777,
            "dir_mode": parent.st_mode & 0o777}

def reset_peak():
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False

cfg = json.loads(sys.argv[1])
async def main():
    ex = SandboxBashExecutor(**cfg["executor"])
    request = BashExecRequest(command=cfg["command"], env=cfg["env"], timeout_ms=cfg["timeout_ms"])
    out = {"reset": reset_peak(), "rss_before": kib("VmRSS")}
    if cfg["background"]:
        proc = await ex.start(ex.resolve(request))
        await proc.wait()
        out["hwm_collect"] = kib("VmHWM")
        reset_peak()
        out["rss_before_read"] = kib("VmRSS")
        read = proc.read_output()
        out["read_chars"] = len(read.delta)
        del read
        out["hwm_after"] = kib("VmHWM")
        out["status"] = proc.status
        await ex.aclose()
    else:
        r = await ex.run(ex.resolve(request))
        out["hwm_after"] = kib("VmHWM")
        out.update(exit_code=r.exit_code, signal=r.signal, timed_out=r.timed_out,
                   stdout_chars=len(r.stdout.text), stdout_truncated=r.stdout.truncated,
                   stderr_chars=len(r.stderr.text), stderr_truncated=r.stderr.truncated,
                   stdout_tail=r.stdout.text[-200:], stderr_tail=r.stderr.text[-200:],
                   stdout_spill=spill_facts(r.stdout.spill_path),
                   stderr_spill=spill_facts(r.stderr.spill_path),
                   spill_dir=ex.spill_directory)
        await ex.aclose()
        for p in (r.stdout.spill_path, r.stderr.spill_path):
            if p:
                os.unlink(p)  # the audit keeps disk use bounded too
    print(json.dumps(out), flush=True)
asyncio.run(main())
"""


async def measured(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run (or start + read) in a child process that reports its own peak RSS and the spill."""
    outcome = Outcome()
    helper = await _spawn_helper(
        env,
        _MEASURED_RUN,
        {
            "executor": _executor_config(env, setup),
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
    path, in the same executor or, with ``data["fresh_executor"]``, in another one."""
    first_ex = env.executor(max_output_bytes=1024, **setup.executor_kwargs)
    outcome = Outcome()
    try:
        first = await first_ex.run(first_ex.resolve(env.request(setup.data["first"])))
        outcome.results.append(first)
        spill = first.stdout.spill_path
        outcome.notes["spill_path"] = spill
        if spill is None:
            return outcome
        second_ex = first_ex
        if setup.data.get("fresh_executor"):
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
    return outcome


# -- runners: a tampered runner runs in a copy-on-write view of the host ----------------------

# Enters a private mount namespace, mounts an overlay of / whose writes land in an upper dir
# under the audit's own directory, binds the other mounts, chroots into it and then (maybe as
# an ordinary user) asks an executor with the operator runner to run the command.
_OVERLAY_RUNNER = r"""
import ctypes, json, os, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def check(r, what):
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
if cfg["overlay"]:
    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    upper, work, merged = cfg["upper"], cfg["work"], cfg["merged"]
    opts = ("lowerdir=/,upperdir=%s,workdir=%s" % (upper, work)).encode()
    check(libc.mount(b"overlay", merged.encode(), b"overlay", 0, opts), "mount overlay")
    mounts = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            f = line.split()
            mounts[f[0]] = (f[1], f[4])
    root_id = next(i for i, (_, mp) in mounts.items() if mp == "/")
    for mid, (parent, mp) in mounts.items():
        if parent == root_id and mp != "/" and not mp.startswith(merged):
            target = merged + mp
            if os.path.isdir(mp) and os.path.isdir(target):
                check(libc.mount(mp.encode(), target.encode(), None, MS_BIND | MS_REC, None),
                      "bind " + mp)
    os.chroot(merged)
    os.chdir("/")
import asyncio
from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError
from bash_seam import BashExecRequest
if cfg.get("uid") is not None:
    for path in cfg["open_up"]:
        os.chmod(path, 0o777 if path in cfg["writable"] else 0o755)
    os.environ["TMPDIR"] = cfg["tmpdir"]
    import tempfile
    tempfile.tempdir = cfg["tmpdir"]
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
async def main():
    out = {"uid": os.getuid()}
    ex = SandboxBashExecutor(**cfg["executor"])
    try:
        r = await ex.run(ex.resolve(BashExecRequest(command=cfg["command"])))
        out.update(exit_code=r.exit_code, stdout=r.stdout.text[-500:], stderr=r.stderr.text[-500:])
    except SandboxUnavailableError as exc:
        out["raised"] = "SandboxUnavailableError: " + exc.detail
    except Exception as exc:
        out["raised"] = type(exc).__name__ + ": " + str(exc)
    finally:
        await ex.aclose()
    print(json.dumps(out), flush=True)
asyncio.run(main())
"""


async def overlay_runner(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run the setup's command through its runner inside a copy-on-write host view."""
    outcome = Outcome()
    config = dict(setup.data["overlay_config"])
    config["executor"] = _executor_config(env, setup)
    config["command"] = setup.command
    helper = await _spawn_helper(env, _OVERLAY_RUNNER, config)
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
