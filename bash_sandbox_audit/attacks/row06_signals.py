"""Row 6: signal or retune a process outside the sandbox (the executor included)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bash_sandbox_audit import drives
from bash_sandbox_audit.attacks.common import (
    attack,
    read_or_empty,
    victim_attack,
)
from bash_sandbox_audit.checks import (
    no_escape_lines,
    verify_attack,
    victim_untouched,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)
from bash_sandbox_audit.targets import (
    Victim,
    proc_field,
    proc_stat_fields,
)

# -- rows 6 and 7: other processes ------------------------------------------------------------


def _nice_unchanged(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    victim: Victim = setup.data["victim"]
    found = []
    fields = proc_stat_fields(victim.pid)
    if fields and fields[16] != "0":
        found.append(f"victim nice value changed to {fields[16]}")
    if proc_field(victim.pid, "Cpus_allowed_list") != setup.data["affinity"]:
        found.append("victim CPU affinity changed")
    if read_or_empty(f"/proc/{victim.pid}/limits") != setup.data["limits"]:
        found.append("victim resource limits changed")
    return found


def _tuning_prepare() -> Callable[[AttackEnv], Awaitable[AttackSetup]]:
    base = victim_attack(
        "_",
        6,
        "_",
        "renice -n 10 -p {{vpid}} && echo 'ESCAPE renice'; "
        "taskset -p 1 {{vpid}} && echo 'ESCAPE taskset'; "
        "prlimit --pid {{vpid}} --nofile=16:16 && echo 'ESCAPE prlimit'; "
        "ionice -c3 -p {{vpid}} && echo 'ESCAPE ionice'",
    )

    async def prepare(env: AttackEnv) -> AttackSetup:
        setup = await base.prepare(env)
        if setup.skip:
            return setup
        victim: Victim = setup.data["victim"]
        data = dict(setup.data)
        data.update(
            affinity=proc_field(victim.pid, "Cpus_allowed_list"),
            limits=read_or_empty(f"/proc/{victim.pid}/limits"),
        )
        return AttackSetup(command=setup.command, data=data)

    return prepare


SIGNAL_SYSCALLS = """
pid = {{vpid}}
attempt("kill(SIGUSR2)", lambda: os.kill(pid, signal.SIGUSR2))
def via_pidfd():
    pfd = sys_call("pidfd_open", pid, 0)
    return sys_call("pidfd_send_signal", pfd, signal.SIGUSR1, None, 0)
attempt("pidfd_open + pidfd_send_signal", via_pidfd)
attempt("tgkill", lambda: sys_call("tgkill", pid, pid, signal.SIGUSR2))
info = (ctypes.c_int * 32)(signal.SIGUSR1, 0, -1)
attempt("rt_sigqueueinfo", lambda: sys_call("rt_sigqueueinfo", pid, signal.SIGUSR1,
                                            ctypes.byref(info)))
"""

ATTACKS: list[Attack] = [
    victim_attack(
        "row6-kill-0-victim",
        6,
        "kill -0 a host process",
        "kill -0 {{vpid}} && echo 'ESCAPE kill -0 reached the victim'",
        no_escape_lines,
    ),
    victim_attack(
        "row6-kill-term-victim",
        6,
        "SIGTERM, SIGHUP, SIGUSR1 a host process",
        "for s in TERM HUP USR1; do kill -$s {{vpid}} && "
        'echo "ESCAPE kill -$s reached the victim"; done',
        no_escape_lines,
    ),
    victim_attack(
        "row6-kill-kill-victim",
        6,
        "SIGKILL a host process",
        "kill -KILL {{vpid}} && echo 'ESCAPE kill -KILL reached the victim'",
        no_escape_lines,
    ),
    victim_attack(
        "row6-stop-cont-victim",
        6,
        "SIGSTOP then SIGCONT a host process",
        "kill -STOP {{vpid}} && echo 'ESCAPE kill -STOP reached the victim'; "
        "sleep 0.2; kill -CONT {{vpid}}",
        no_escape_lines,
    ),
    victim_attack(
        "row6-kill-process-group",
        6,
        "signal a host process group",
        "kill -TERM -- -{{vpid}} && echo 'ESCAPE kill -TERM reached the group'; "
        "kill -0 -- -{{vpid}} && echo 'ESCAPE kill -0 reached the group'",
        no_escape_lines,
    ),
    victim_attack(
        "row6-signal-syscalls",
        6,
        "kill(2), pidfd_send_signal, tgkill, rt_sigqueueinfo",
        SIGNAL_SYSCALLS,
        no_escape_lines,
        python=True,
    ),
    attack(
        "row6-kill-0-executor",
        6,
        "kill -0 the executor's own process (signal 0 only)",
        "kill -0 {{audit_pid}} && echo 'ESCAPE kill -0 reached the executor'; "
        "{{py}} -c 'import os; os.kill({{audit_pid}}, 0); "
        'print("ESCAPE os.kill(executor, 0) succeeded")\'',
        no_escape_lines,
    ),
    Attack(
        "row6-retune-victim",
        6,
        "renice, taskset, prlimit, ionice a host process",
        _tuning_prepare(),
        verify_attack(no_escape_lines, _nice_unchanged, victim_untouched),
        drives.foreground,
    ),
]
