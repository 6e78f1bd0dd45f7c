"""The front end: the `bash-sandbox` command line (run, mode, doctor, audit) and its config file."""

from bash_sandbox.cli.main import main

__all__ = ["main"]
