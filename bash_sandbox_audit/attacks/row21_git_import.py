"""Row 21: lose the user's data through the git import.

Each attack starts from a real repository on ``main`` and a confined command that commits.

* ``row21-import-host-lock-*`` / ``row21-import-host-commit``: the host's git holds
  ``index.lock`` or ``refs/heads/main.lock``, or commits on ``main``, while the command commits.
  Afterwards the host's lock or commit is untouched, nothing is applied, the command's commit
  is reachable at its keep-ref (``refs/bash-sandbox/...``) and the result's
  `SandboxFacts.git` says ``conflict``.
* ``row21-import-crash-<point>``: the executor runs in a helper process with the import's
  crash-injection hook (`git_import.CRASH_ENV`) naming one write point: it dies on the spot
  there (``row21-import-executor-killed``: SIGKILLed after the command committed, before any
  import). The host repository must be `git fsck --full` clean right after, and again once
  the dead executor's state is recovered as the next executor's sweep does, with the
  command's commit reachable from a ref and no lock left behind.

Judged with the host's git from outside the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from typing import Any

from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.git_import import CRASH_ENV, KEEP_NAMESPACE, WRITE_POINTS
from bash_sandbox.state import recover_stale, remove_tree
from bash_sandbox_audit.attacks.common import BEGIN, Render, scenario
from bash_sandbox_audit.checks import Check
from bash_sandbox_audit.drives import executor_config, spawn_helper
from bash_sandbox_audit.host_git import git, git_available, init_repo
from bash_sandbox_audit.model import (
    TOKEN_VARIABLE,
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    audit_error,
    contained,
    escaped,
)
from bash_sandbox_audit.programs import program_text
from bash_sandbox_audit.targets import poll_until
from bash_seam import BashExecError, GitImportStatus

CRASH_EXIT = 86  # what the hook exits with (`transaction.crash_point`)
KILLED = "killed"  # not a write point: the executor SIGKILLed while the command runs
HOST_LOCK_TEXT = "the host's git is mid-operation\n"


def _repo(env: AttackEnv) -> dict[str, Any]:
    if why := git_available():
        return {"skip": why}
    init_repo(env, env.ws)
    return {"main_before": git(env, env.ws, "rev-parse", "main").stdout.strip()}


def fsck_problems(env: AttackEnv, when: str) -> list[str]:
    done = git(env, env.ws, "fsck", "--full", "--no-dangling", check=False)
    if done.returncode != 0 or done.stderr.strip():
        return [f"git fsck --full {when}: {(done.stdout + done.stderr).strip()[:300]}"]
    return []


def reachable(env: AttackEnv, oid: str) -> bool:
    """Whether ``oid`` is reachable from some ref (a branch or a keep-ref) on the host."""
    refs = git(env, env.ws, "for-each-ref", "--format=%(objectname)", check=False).stdout.split()
    return any(
        git(env, env.ws, "merge-base", "--is-ancestor", oid, ref, check=False).returncode == 0
        for ref in refs
    )


def leftover_locks(env: AttackEnv) -> list[str]:
    gitdir = os.path.join(env.ws, ".git")
    return [f"{n} left on the host" for n in ("index.lock", "HEAD.lock") if os.path.lexists(
        os.path.join(gitdir, n)
    )]  # fmt: skip


# -- the host's git acts while the command commits -------------------------------------------

# Still running when the host acts: it waits (at most 3 s) until it sees the act done.
ACT_COMMAND = (
    "echo more >> README && git commit -qam more && echo READY"
    " && for i in $(seq 60); do [ -e {{seen}} ] && break; sleep 0.05; done\n"
)
HostAct = Callable[[AttackEnv, AttackSetup, Outcome], None]


def _take_lock(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> None:
    with open(setup.data["lock"], "x") as fh:  # O_EXCL, as git takes it
        fh.write(HOST_LOCK_TEXT)


def _host_commits(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> None:
    with open(os.path.join(env.ws, "h.txt"), "w") as fh:
        fh.write("host\n")
    git(env, env.ws, "add", "h.txt")
    git(env, env.ws, "commit", "-qm", "host")
    outcome.notes["host_commit"] = git(env, env.ws, "rev-parse", "main").stdout.strip()
    with open(os.path.join(env.ws, "host-done"), "w"):
        pass


async def act_while_committing(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """`start()` the command; once it committed (``READY``), let the host's git act (take
    a lock, commit), and wait for the command (and its import) to finish."""
    outcome = Outcome()
    act: HostAct = setup.data["host_act"]
    ex = env.executor(**setup.executor_kwargs)
    try:
        proc = await ex.start(ex.resolve(env.request(setup.command, timeout_ms=setup.timeout_ms)))
    except (SandboxUnavailableError, BashExecError) as exc:
        outcome.error = exc
        return outcome
    text = ""

    def ready() -> bool:
        nonlocal text
        text += proc.read_output().delta
        return "READY" in text or proc.status != "running"

    try:
        await poll_until(ready, 15)
        if "READY" in text:
            await asyncio.to_thread(act, env, setup, outcome)
            outcome.notes["acted"] = True
        await asyncio.wait_for(proc.wait(), 20)
    except TimeoutError:
        proc.kill()
    finally:
        text += proc.read_output().delta
        outcome.texts.append(text)
        outcome.notes["facts"] = proc.sandbox
    return outcome


def _lock_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    lock: str = setup.data["lock"]
    found: list[str] = []
    with open(lock) as fh:
        if fh.read() != HOST_LOCK_TEXT:
            found.append(f"the host's {os.path.basename(lock)} was replaced")
    os.unlink(lock)  # the host's git is done: look at the repository as its user would
    if (now := git(env, env.ws, "rev-parse", "main").stdout.strip()) != setup.data["main_before"]:
        found.append(f"main moved to {now[:12]} under the host's lock")
    return found


def _host_commit_kept(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    now = git(env, env.ws, "rev-parse", "main").stdout.strip()
    if now != outcome.notes["host_commit"]:
        return [f"main is {now[:12]}, not the host's own commit made during the command"]
    return []


def _judge_act(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    if outcome.error is not None:
        return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
    if not outcome.notes.get("acted"):
        return audit_error("premise failed: the command never committed", outcome.texts[-1:])
    found: list[str] = setup.data["host_check"](env, setup, outcome)
    facts = outcome.notes.get("facts")
    outcomes = facts.git if facts is not None else ()
    if not outcomes or outcomes[0].status is not GitImportStatus.CONFLICT:
        found.append(f"SandboxFacts.git does not say conflict: {[o.status for o in outcomes]}")
    else:
        kept = f"{outcomes[0].kept_at}/heads/main"
        done = git(env, env.ws, "log", "-1", "--format=%s", kept, "--", check=False)
        if done.stdout.strip() != "more":
            found.append(f"the command's commit is not at its keep-ref {kept}")
    found += fsck_problems(env, "after the conflict")
    return escaped(found[0], found) if found else contained("conflict reported, commit kept")


def _act_attack(id: str, title: str, act: HostAct, check: Check, **values: str) -> Attack:
    def extra(env: AttackEnv) -> dict[str, Any]:
        premise = _repo(env)
        premise.update(values, host_act=act, host_check=check)
        if "lock" in values:
            premise["lock"] = os.path.join(env.ws, ".git", values["lock"])
        return premise

    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        return {"command": render(BEGIN + "cd {{ws}}\n" + ACT_COMMAND)}

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        return await asyncio.to_thread(_judge_act, env, setup, outcome)

    return scenario(
        id,
        21,
        title,
        build,
        git="none",
        extra=extra,
        modes=WORKSPACE_WRITE,
        drive=act_while_committing,
        verify=verify,
    )


def _lock_attack(name: str, lock: str) -> Attack:
    return _act_attack(
        f"row21-import-host-lock-{name}",
        f"the host's git holds .git/{lock} while the command commits",
        _take_lock,
        _lock_kept,
        lock=lock,
        seen=f".git/{lock}",
    )


# -- crash injection at each write point of the import ---------------------------------------

# A commit on a new branch it switches to, and a staged file: every write point is reached.
CRASH_COMMAND = (
    "git switch -q -c feature && echo two > two.txt && git add two.txt && git commit -qm two"
    " && git rev-parse HEAD > .audit-commit && echo staged > staged.txt && git add staged.txt"
    " && echo COMMITTED\n"
)


def _open_gate(gate: str) -> None:
    with open(gate, "w"):
        pass


def _helper_state_lock(pid: int, parent: str) -> str | None:
    """The executor state lock file in ``parent`` the helper ``pid`` holds open (None until
    it has one)."""
    fds = f"/proc/{pid}/fd"
    with contextlib.suppress(OSError):
        for fd in os.listdir(fds):
            with contextlib.suppress(OSError):
                target = os.readlink(os.path.join(fds, fd))
                if os.path.dirname(os.path.dirname(target)) == parent and target.endswith("/lock"):
                    return target
    return None


def _take_over(lock: str) -> tuple[int, str] | None:
    """Wait for the helper's state lock (released when it dies) and hold it: no other
    executor on this host sweeps the dead state before the audit's recovery looks at it.
    Blocks until the helper is gone (the drive kills it on a timeout)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, os.path.dirname(lock)


def _recover_as_the_next_executor(held: tuple[int, str]) -> None:
    """What the next executor's `sweep_stale` does with a dead executor's state under its
    lock: the stale-state hooks (the git import's journal rolled forward or back), then the
    removal when they all succeeded."""
    fd, path = held
    try:
        if recover_stale(path):
            remove_tree(path)
    finally:
        os.close(fd)


async def crash_in_the_import(env: AttackEnv, setup: AttackSetup) -> Outcome:
    """Run the command on an executor in a helper process whose import dies at the write
    point; the audit holds the dead executor's state lock as soon as it is released, looks
    at the host, then recovers the state as the next executor's sweep does, and starts a
    fresh executor."""
    outcome = Outcome()
    # The helper runs its command only once the audit has found its state lock: without
    # the gate a fast helper could take, crash and release it between two looks. And it
    # keeps its state in a directory of this cell's own: an executor's start recovers any
    # dead executor's state it finds beside its own, and a helper armed to die at a write
    # point died in the recovery of another crash cell's state (running at the same time),
    # before its own command ran ("the command never committed", or no lock ever taken).
    own, parent = _cell_dirs()
    try:
        return await _crash_behind(env, setup, outcome, own, parent)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _cell_dirs() -> tuple[str, str]:
    """The cell's own temp dir, and where an executor started with it as TMPDIR keeps its
    state (`state_parent`: this uid's base below it)."""
    own = tempfile.mkdtemp(prefix="audit-crash-")
    return own, os.path.realpath(os.path.join(own, f"bash-sandbox-{os.geteuid()}", "state"))


async def _crash_behind(
    env: AttackEnv, setup: AttackSetup, outcome: Outcome, tmp: str, parent: str
) -> Outcome:
    gate = f"{tmp}/go"
    config = {
        "executor": executor_config(env, setup),
        "commands": [setup.command],
        "env": {TOKEN_VARIABLE: env.token},
        "timeout_ms": setup.timeout_ms,
        "gate": gate,
    }
    helper = await spawn_helper(
        env,
        program_text("executor_session.py"),
        config,
        # The cell's own temp dir: the audit recovers the helper's state there itself, as
        # the next executor's sweep would (`_recover_as_the_next_executor`).
        {"TMPDIR": tmp, **setup.data["process_env"]},
    )
    # Generous: the helper imports the runtime and starts an executor on a loaded machine.
    await poll_until(
        lambda: _helper_state_lock(helper.pid, parent) is not None or helper.returncode is not None,
        60,
    )
    lock = _helper_state_lock(helper.pid, parent)
    taking = asyncio.ensure_future(asyncio.to_thread(_take_over, lock)) if lock else None
    await asyncio.to_thread(_open_gate, gate)  # the helper's command may run now
    if setup.data["point"] == KILLED:  # SIGKILL mid-command, once it committed
        committed = os.path.join(env.ws, ".audit-committed")
        await poll_until(lambda: os.path.exists(committed) or helper.returncode is not None, 20)
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.pid, signal.SIGKILL)
    try:
        stdout, stderr = await asyncio.wait_for(helper.communicate(), 40)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.pid, signal.SIGKILL)
        outcome.notes["helper_output"] = "the executor's helper process timed out"
        stdout, stderr = await helper.communicate()
    held = await taking if taking is not None else None
    outcome.notes["rc"] = helper.returncode
    outcome.notes["held"] = held is not None
    outcome.notes["helper_stderr"] = stderr.decode(errors="replace")[-1000:]
    for line in stdout.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            outcome.texts.append(json.dumps(json.loads(line))[:500])
    outcome.notes["after_crash"] = await asyncio.to_thread(fsck_problems, env, "after the crash")
    if held is not None:
        await asyncio.to_thread(_recover_as_the_next_executor, held)
    try:  # the next executor starts on the recovered host
        ex = env.executor(**setup.executor_kwargs)
        outcome.result = await ex.run(ex.resolve(env.request("true")))
    except (SandboxUnavailableError, BashExecError) as exc:
        outcome.error = exc
    return outcome


def _judge_crash(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    point = setup.data["point"]
    if outcome.error is not None:
        return audit_error(f"the next executor raised {type(outcome.error).__name__}")
    if not outcome.notes.get("held"):
        return audit_error(
            "premise failed: the dead executor's state lock was never taken "
            f"(helper exit {outcome.notes.get('rc')})",
            [str(outcome.notes.get("helper_stderr", ""))[-300:]],
        )
    if outcome.notes.get("rc") != setup.data["exit"]:
        return audit_error(
            f"premise failed: the import never reached {point} (exit {outcome.notes.get('rc')})",
            [str(outcome.notes.get("helper_stderr", ""))[-300:], *outcome.texts[-1:]],
        )
    try:
        with open(os.path.join(env.ws, ".audit-commit")) as fh:
            commit = fh.read().strip()
    except OSError:
        # What the repository and the helper say, to tell a failed commit from a lost file.
        refs = git(env, env.ws, "log", "--all", "--oneline", "-n", "5", check=False).stdout.strip()
        return audit_error(
            "premise failed: the command never committed",
            [f"refs: {refs!r}", str(outcome.notes.get("helper_stderr", ""))[-300:]],
        )
    found: list[str] = list(outcome.notes.get("after_crash", []))
    found += fsck_problems(env, "after the next executor's recovery")
    if not reachable(env, commit):
        found.append(f"the command's commit {commit[:12]} is reachable from no ref on the host")
    found += leftover_locks(env)
    head = git(env, env.ws, "symbolic-ref", "HEAD", check=False).stdout.strip()
    keep = git(env, env.ws, "for-each-ref", KEEP_NAMESPACE, check=False).stdout.strip()
    if head == "refs/heads/feature":  # rolled forward: all of it
        staged = git(env, env.ws, "diff", "--cached", "--name-only", check=False).stdout.split()
        if git(env, env.ws, "rev-parse", "feature").stdout.strip() != commit:
            found.append("rolled forward, but feature is not the command's commit")
        if staged != ["staged.txt"]:
            found.append(f"rolled forward, but the index stages {staged}")
    elif head == "refs/heads/main":  # rolled back: none of it, the commit kept
        if git(env, env.ws, "rev-parse", "main").stdout.strip() != setup.data["main_before"]:
            found.append("rolled back, but main moved")
        if not keep:
            found.append("rolled back, but no keep-ref holds the command's commit")
    else:
        found.append(f"HEAD is {head or 'unreadable'} after the recovery")
    if found:
        return escaped(found[0], found)
    return contained(f"{point}: fsck clean, commit kept ({head.rsplit('/', 1)[-1]})")


def _crash_attack(point: str) -> Attack:
    killed = point == KILLED

    def extra(env: AttackEnv) -> dict[str, Any]:
        values = _repo(env)
        values["point"] = point
        values["process_env"] = {} if killed else {CRASH_ENV: point}
        values["exit"] = -signal.SIGKILL if killed else CRASH_EXIT
        return values

    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        command = CRASH_COMMAND + ("touch .audit-committed && sleep 5\n" if killed else "")
        return {"command": render(BEGIN + "cd {{ws}}\n" + command)}

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        return await asyncio.to_thread(_judge_crash, env, setup, outcome)

    return scenario(
        "row21-import-executor-killed" if killed else f"row21-import-crash-{point}",
        21,
        "the executor is SIGKILLed after the command committed, before any import"
        if killed
        else f"the executor dies at the import's `{point}` write point (crash-injection hook)",
        build,
        git="none",
        extra=extra,
        modes=WORKSPACE_WRITE,
        drive=crash_in_the_import,
        verify=verify,
    )


ATTACKS: list[Attack] = [
    _lock_attack("index", "index.lock"),
    _lock_attack("ref", "refs/heads/main.lock"),
    _act_attack(
        "row21-import-host-commit",
        "the host commits on main while the command commits on main",
        _host_commits,
        _host_commit_kept,
        seen="host-done",
    ),
    *(_crash_attack(point) for point in WRITE_POINTS),
    _crash_attack(KILLED),
]
