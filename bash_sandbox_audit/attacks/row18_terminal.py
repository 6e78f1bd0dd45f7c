"""Row 18: write control sequences to the user's terminal through the CLI.

The real `bash-sandbox run` runs in a subprocess whose stdout and stderr are a fresh
pseudo-terminal (raw, so the line discipline adds nothing); the command prints an OSC 52
clipboard write, an OSC 0 title, a screen clear and a fake ``[exit 0]`` line after a
carriage return. The bytes the terminal received are read from its master side: no ESC,
BEL, lone CR or other control byte (newline, CR LF and tab aside) may arrive, and the
sequences must still be visible as text. With stdout a pipe, the output must stay byte-exact.
"""

from __future__ import annotations

from typing import Any

from bash_sandbox_audit import scenarios
from bash_sandbox_audit.attacks.common import Render, scenario
from bash_sandbox_audit.checks import verify_control
from bash_sandbox_audit.model import READ_ONLY, Attack, AttackEnv, AttackSetup, Outcome

# printf's octal escapes keep the command's own text free of control bytes.
SEQUENCES = (
    "printf '\\033]52;c;QVVESVQtQ0xJUEJPQVJE\\007\\033]0;AUDIT-TITLE\\007\\033[2J\\033[H"
    "\\r[exit 0]\\nAUDIT-AFTER\\n'; printf '\\033]0;AUDIT-STDERR-TITLE\\007\\r\\n' >&2"
)
STDOUT_BYTES = (
    b"\x1b]52;c;QVVESVQtQ0xJUEJPQVJE\x07\x1b]0;AUDIT-TITLE\x07\x1b[2J\x1b[H\r[exit 0]\n"
    b"AUDIT-AFTER\n"
)
# Text that must stay visible once the control bytes are rendered harmless.
VISIBLE = (b"52;c;QVVESVQtQ0xJUEJPQVJE", b"AUDIT-TITLE", b"[2J", b"[exit 0]", b"AUDIT-STDERR-TITLE")
ALLOWED_CONTROLS = frozenset(b"\n\t")
# The CLI renders output the same whatever the mode: one mode per backend keeps it fast.
CLI_MODES = READ_ONLY


def _run(env: AttackEnv, *, on_pty: bool) -> scenarios.Step:
    return scenarios.cli(
        "run",
        "--backend",
        env.backend,
        "--mode",
        env.mode.value,
        "--workspace",
        env.ws,
        "--",
        SEQUENCES,
        on_pty=on_pty,
    )


def terminal_saw_no_controls(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    received: bytes = outcome.notes["cli"][0]["stdout"]
    # CR LF is a line ending (what the tty itself sends for a newline); a lone CR is not.
    received = received.replace(b"\r\n", b"\n")
    controls = sorted(
        {b for b in received if (b < 0x20 and b not in ALLOWED_CONTROLS) or b == 0x7F}
    )
    found = []
    if controls:
        found.append(
            f"the terminal received control bytes {[hex(b) for b in controls]} (ESC "
            f"{received.count(0x1B)}x, BEL {received.count(0x07)}x, CR {received.count(0x0D)}x)"
        )
    hidden = [v.decode() for v in VISIBLE if v not in received]
    if hidden:
        found.append(f"sequences were dropped instead of rendered visibly: {hidden}")
    return found


def output_byte_exact(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    out: bytes = outcome.notes["cli"][0]["stdout"]
    if out != STDOUT_BYTES:
        return [f"stdout on a pipe is not byte-exact: {out[:80]!r}"]
    return []


def _on_pty(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {"steps": [_run(env, on_pty=True)]}


def _on_pipe(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {"steps": [_run(env, on_pty=False)]}


ATTACKS: list[Attack] = [
    scenario(
        "row18-terminal-control-sequences",
        18,
        "bash-sandbox run on a terminal: OSC 52 clipboard, OSC 0 title, ESC[2J, a fake "
        "[exit 0] after CR",
        _on_pty,
        terminal_saw_no_controls,
        markers=("AUDIT-AFTER",),
        modes=CLI_MODES,
    ),
]

CONTROLS: list[Attack] = [
    scenario(
        "row18-control-pipe-byte-exact",
        18,
        "bash-sandbox run with stdout on a pipe passes the same bytes through unchanged",
        _on_pipe,
        verify=verify_control("AUDIT-AFTER", checks=[output_byte_exact]),
        kind="control",
        modes=CLI_MODES,
    ),
]
