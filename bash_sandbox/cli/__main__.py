"""`python -m bash_sandbox.cli`: the same entry point as the `bash-sandbox` console script."""

from bash_sandbox.cli.main import main

raise SystemExit(main())
