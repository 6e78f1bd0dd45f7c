"""Row 11: outlive the run (daemonised grandchildren after every way a run ends)."""

from __future__ import annotations

from bash_sandbox_audit import drives
from bash_sandbox_audit.attacks.common import (
    BEGIN,
    needs_python,
)
from bash_sandbox_audit.checks import (
    shorten,
)
from bash_sandbox_audit.layout import (
    build_layout,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Drive,
    Finding,
    Outcome,
    Verify,
    audit_error,
    contained,
    escaped,
)
from bash_sandbox_audit.programs import program_text
from bash_sandbox_audit.targets import (
    wait_tagged_gone,
)

# -- row 11: outliving the run ---------------------------------------------------------------

# Six ways to daemonise (bash_sandbox_audit/programs/daemons.sh); the host finds each
# daemon by the run token in its argv[0].
DAEMONS = program_text("daemons.sh")
DAEMON_COUNT = 6


def _verify_lifetime(trigger: str) -> Verify:
    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        if outcome.error is not None:
            return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
        seen: list[tuple[int, str]] = outcome.notes.get("seen", [])
        if len(seen) < DAEMON_COUNT:
            return audit_error(
                f"premise failed: {len(seen)} of {DAEMON_COUNT} daemons appeared on the host",
                [c for _, c in seen]
                or [shorten(env, str(outcome.notes.get("helper_stderr", ""))[-300:])],
            )
        survivors = await wait_tagged_gone(env.token, 5)
        if survivors:
            return escaped(
                f"{len(survivors)} process(es) of the command survived {trigger}",
                [f"pid {p.pid}: {p.cmdline}" for p in survivors],
            )
        return contained(f"all {len(seen)} daemons died after {trigger}")

    return verify


def lifetime_attack(trigger: str, title: str, tail: str, timeout_ms: int, drive: Drive) -> Attack:
    async def prepare(env: AttackEnv) -> AttackSetup:
        if why := needs_python(env):
            return AttackSetup(skip=why)
        build_layout(env)
        return AttackSetup(
            command=env.render(BEGIN + DAEMONS + tail),
            timeout_ms=timeout_ms,
            data={"tag": f"{env.token}-dmn-", "expected": DAEMON_COUNT},
        )

    return Attack(
        f"row11-after-{trigger}", 11, title, prepare, _verify_lifetime(trigger), drive, budget_s=60
    )


ATTACKS: list[Attack] = [
    lifetime_attack(
        "exit",
        "daemons planted by a foreground command that exits normally",
        # Long enough for the host to see every daemon before the exit, under load too.
        "sleep 3\n",
        30_000,
        drives.lifetime("exit"),
    ),
    lifetime_attack(
        "timeout",
        "daemons planted by a command that times out",
        "sleep 300\n",
        2_500,
        drives.lifetime("timeout"),
    ),
    lifetime_attack(
        "abort",
        "daemons planted by a command aborted via AbortController",
        "sleep 300\n",
        30_000,
        drives.lifetime("abort"),
    ),
    lifetime_attack(
        "cancel",
        "daemons planted by a command whose awaiting task is cancelled",
        "sleep 300\n",
        30_000,
        drives.lifetime("cancel"),
    ),
    lifetime_attack(
        "kill",
        "daemons planted by a background process that is kill()ed",
        "sleep 300\n",
        30_000,
        drives.lifetime("kill"),
    ),
    lifetime_attack(
        "aclose",
        "daemons planted by a background process when the executor is aclose()d",
        "sleep 300\n",
        30_000,
        drives.lifetime("aclose"),
    ),
    lifetime_attack(
        "background-exit",
        "daemons planted by a background process that exits",
        "sleep 1\n",
        30_000,
        drives.lifetime("background-exit"),
    ),
    lifetime_attack(
        "executor-sigkill",
        "daemons planted while the executor's process is SIGKILLed",
        "sleep 300\n",
        30_000,
        drives.executor_sigkilled,
    ),
]
