"""The front end: the `bash-sandbox` command line (run, mode, doctor, audit) and its config file."""

import gc

# Importing the CLI allocates a few hundred thousand long-lived objects (modules, classes,
# pydantic schemas) and almost no garbage: collector passes over them would be wasted time
# (about 10 ms of a run here). Collection resumes as soon as the import is done.
_collecting = gc.isenabled()
gc.disable()
try:
    from bash_sandbox.cli.main import main
finally:
    if _collecting:
        gc.enable()

__all__ = ["main"]
