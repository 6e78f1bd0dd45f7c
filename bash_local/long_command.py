"""A command longer than one exec argument runs anyway: handed to bash in a sealed memfd.

Linux refuses an exec whose single argument exceeds MAX_ARG_STRLEN (131072 bytes with its
NUL), so `bash -c <command>` cannot carry a 200 KB script. Such a command is written to a
sealed memfd (nothing on disk, immutable once sealed) passed as one inherited descriptor,
and `bash -c` gets a short script of builtins that reads it, closes the descriptor and
`eval`s it:

    IFS= read -r -d '' v <&N; exec N<&-; eval "unset v; $v"

What the command sees is what `bash -c` gives it: the same `$0` (bash's path) and no
positional parameters, stdin untouched, the descriptor closed before the first line runs,
no extra variable. The argv keeps its `(bash, "-c", script)` shape, so every backend wraps
it as usual, and reading an inherited descriptor needs no path access under any sandbox.
Shorter commands are left exactly as they were.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import sys
import weakref

from bash_local.argv_limits import MAX_ARG_STRLEN, check_exec_size
from bash_local.spawn import SpawnPlan

_VARIABLE = "__bash_sandbox_command"
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def reader_script(fd: int) -> str:
    """The `bash -c` script that runs the command held by descriptor ``fd``."""
    return (
        f"IFS= read -r -d '' {_VARIABLE} <&{fd}; exec {fd}<&-; "
        f'eval "unset {_VARIABLE}; ${_VARIABLE}"'
    )


def _sealed_memfd(data: bytes) -> int:
    fd = os.memfd_create("bash-sandbox-command", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fit_exec_limits(plan: SpawnPlan) -> SpawnPlan:
    """``plan``, with a command too long for argv moved into a memfd (Linux); raises
    `CommandTooLargeError` for what still cannot be exec'd (a huge environment entry)."""
    argv = plan.argv
    command = os.fsencode(argv[2]) if len(argv) == 3 and argv[1] == "-c" else b""
    if len(command) + 1 <= MAX_ARG_STRLEN or not sys.platform.startswith("linux"):
        check_exec_size(plan.argv, plan.env)
        return plan
    # Checked with the short script in place first: nothing is created for a plan that
    # fails anyway (its environment is too large).
    check_exec_size((argv[0], "-c", reader_script(2**31 - 1)), plan.env)
    fd = _sealed_memfd(command)
    previous = plan.release

    def release() -> None:
        close_fd()
        if previous is not None:
            previous()

    # Closed by `release()`, or when the plan is dropped unspawned (a confining step that
    # raised never calls it): whichever comes first, once.
    close_fd = weakref.finalize(release, os.close, fd)

    return dataclasses.replace(
        plan,
        argv=(argv[0], "-c", reader_script(fd)),
        pass_fds=(*plan.pass_fds, fd),
        release=release,
    )
