"""The Python entry (`bash-sandbox-py`, and `bash-sandbox` itself where the native client
could not be built): through the warm daemon when asked for, else the CLI.

Imports nothing heavy before it knows which (the warm path's point is to skip the CLI's
imports).
"""

from __future__ import annotations

import _signal  # `signal` imports enum (see `warm.client`)
import os
import sys


def main() -> int:
    # Ignored dispositions survive exec: a parent that ignores SIGCHLD (a daemon's way never
    # to wait) would have the kernel reap this process's children, and the run would wait
    # for an exit status that never comes. Every child here is the CLI's own.
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    argv = sys.argv[1:]
    from bash_sandbox.warm import client, wire

    # The native client's hand-over (`warm/native/client.c`): never part of the run's
    # environment, whether the daemon serves it or it runs fresh.
    key = os.environ.pop(wire.KEY_ENV, None)
    if client.wanted(argv):
        status = client.run(argv, key)
        if isinstance(status, client.Signalled):
            # Die of the same signal, as the fresh process would have.
            _signal.signal(status.signum, _signal.SIG_DFL)
            os.kill(os.getpid(), status.signum)
            return 128 + status.signum
        if status is not None:
            # Nothing here needs the interpreter's teardown (no file, no buffered output but
            # stderr's note), which costs a call 2-3 ms: out at once.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    from bash_sandbox.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
