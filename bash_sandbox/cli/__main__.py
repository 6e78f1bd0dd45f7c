"""`python -m bash_sandbox.cli`: the same entry point as the `bash-sandbox` console script."""

import signal

from bash_sandbox.cli.main import main

signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as `bash_sandbox.entry.main` does, and why
raise SystemExit(main())
