"""Row 20: carry code across a trust boundary through what a command leaves behind.

- Auto-run files: a workspace-write command (under the default policy, whose protected
  names include them) writes the files editors, direnv and agent tools run on open. Each
  must be absent from the host afterwards (no placeholder left either).
- Across a widening: an isolated read-only call plants a script in the private /tmp and
  /dev/shm; the next call of the same executor runs with the host network and executes
  whatever it finds there, which would connect to a server the audit bound. The server
  must see nothing.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from bash_sandbox import SandboxBashExecutor
from bash_sandbox_audit import scenarios
from bash_sandbox_audit.attacks.common import BEGIN, FILES, Render, attack, scenario
from bash_sandbox_audit.checks import servers_silent
from bash_sandbox_audit.model import WORKSPACE_WRITE, Attack, AttackEnv, AttackSetup, Outcome
from bash_sandbox_audit.targets import start_server
from policies import NetworkMode, SandboxMode

_AUTORUN = (".vscode/tasks.json", ".envrc", ".mcp.json", ".claude/settings.json", ".idea/x.xml")


def _autorun_guards(env: AttackEnv) -> dict[str, Any]:
    return {"guards": {f"ws/{name}": os.path.join(env.ws, name) for name in _AUTORUN}}


ATTACKS: list[Attack] = [
    attack(
        "row20-autorun-files",
        20,
        "write the files editors, direnv and agents run on open (.vscode/tasks.json, "
        ".envrc, .mcp.json, .claude/settings.json, .idea/) under the default policy",
        "cd {{ws}}\n"
        + "".join(
            f"mkdir -p $(dirname {n}) 2>/dev/null; echo pwned > {n} && echo 'ESCAPE wrote {n}'\n"
            for n in _AUTORUN
        ),
        *FILES,
        git="none",
        extra=_autorun_guards,
        modes=WORKSPACE_WRITE,
    ),
]


def _listener(env: AttackEnv) -> dict[str, Any]:
    af, st = socket.AF_INET, socket.SOCK_STREAM
    try:
        server = start_server(af, st, ("127.0.0.1", 0), "tcp 127.0.0.1", env.cleanup)
    except OSError as exc:
        return {"skip": f"cannot bind the tcp server here: {exc.strerror}"}
    return {"servers": [server], "tcp_port": server.sock.getsockname()[1]}


def widened(command: str) -> scenarios.Step:
    """Run ``command`` in the executor of the previous steps, under its own default policy
    with the host network: the call a user approved for the network."""

    async def step(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> None:
        ex: SandboxBashExecutor = outcome.notes["executors"]["main"]
        spec = ex.resolve(env.request(command, timeout_ms=setup.timeout_ms))
        assert spec.sandbox_policy is not None
        wide = spec.sandbox_policy.model_copy(update={"network": NetworkMode.HOST})
        result = await ex.run(spec.model_copy(update={"sandbox_policy": wide}))
        outcome.results.append(result)
        outcome.result = result

    return step


def _plant_then_widen(env: AttackEnv, render: Render) -> dict[str, Any]:
    script = "exec 3<>/dev/tcp/127.0.0.1/{{tcp_port}}; echo planted >&3"
    plant = render(
        BEGIN + f"printf '%s\\n' '{script}' > /tmp/w.sh; cp /tmp/w.sh /dev/shm/w.sh; echo planted"
    )
    run = render(BEGIN + "bash /tmp/w.sh; bash /dev/shm/w.sh; ls -A /tmp /dev/shm")
    return {"steps": [scenarios.confined(plant), widened(run)]}


ATTACKS += [
    scenario(
        "row20-tmp-across-widening",
        20,
        "an isolated read-only call plants a script in /tmp and /dev/shm; the next call, "
        "approved for the host network, runs it (it connects to a host listener)",
        _plant_then_widen,
        servers_silent,
        git="none",
        extra=_listener,
        drive=scenarios.steps,
        modes=frozenset({SandboxMode.READ_ONLY}),
    ),
]
