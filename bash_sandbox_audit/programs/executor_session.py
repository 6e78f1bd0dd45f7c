"""Run commands one after another on one executor made in this process's own environment.

For attacks whose premise is the executor's *process* environment (its PATH, TMPDIR or
inherited credentials), which the audit cannot change for itself without affecting every
other attack. Run as ``python -c TEXT CONFIG_JSON`` with ``kind`` ("sandbox" or "local"),
``executor`` (keyword arguments), ``commands``, ``env`` (each request's environment) and
``timeout_ms``; prints one JSON line per command: ``{"result": ...}`` (a `BashRunResult`)
or ``{"error": ..., "type": ...}``. With ``gate`` (a path), the commands wait, once the
executor exists, until that file does (at most 60 s): the audit looks at the executor's
state before anything runs.
"""

import asyncio
import json
import os
import sys
import time

from bash_local import LocalBashExecutor
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

cfg = json.loads(sys.argv[1])


def _wait_for_gate(gate: str | None) -> None:
    deadline = time.monotonic() + 60
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


async def main() -> None:
    kind = cfg.get("kind", "sandbox")
    ex = (
        LocalBashExecutor(**cfg["executor"])
        if kind == "local"
        else SandboxBashExecutor(**cfg["executor"])
    )
    try:
        await asyncio.to_thread(_wait_for_gate, cfg.get("gate"))
        for command in cfg["commands"]:
            request = BashExecRequest(
                command=command, env=cfg["env"], timeout_ms=cfg.get("timeout_ms", 15_000)
            )
            try:
                result = await ex.run(ex.resolve(request))
            except Exception as exc:  # reported to the audit, which judges it
                line = {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__}
                print(json.dumps(line), flush=True)
                continue
            print(json.dumps({"result": result.model_dump(mode="json")}), flush=True)
    finally:
        await ex.aclose()


asyncio.run(main())
