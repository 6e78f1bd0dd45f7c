"""A child process that owns an executor, starts the daemonising command in the background
and then idles until the audit SIGKILLs it: nothing of it may survive its executor.

Run as ``python -c TEXT CONFIG_JSON`` with ``executor`` (keyword arguments), ``command``
and ``env`` (the request's environment).
"""

import asyncio
import json
import sys

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

cfg = json.loads(sys.argv[1])


async def main() -> None:
    ex = SandboxBashExecutor(**cfg["executor"])
    proc = await ex.start(ex.resolve(BashExecRequest(command=cfg["command"], env=cfg["env"])))
    print("STARTED", proc.id, flush=True)
    await asyncio.sleep(600)


asyncio.run(main())
