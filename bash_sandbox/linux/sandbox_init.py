"""The compiled init (`native/sandbox_init.c`), where the package's build made it: the
Landlock backend's PID 1 (else a bash), and on both backends the waiter of the spawn
helper's children and of the compiled child started from the executor, which execs it
(`--wait`) rather than wait as a copy of its parent (`BackendContext.hold_init`).

The child opens the init before it leaves its parent's mount namespace (`ChildSetup.
hold_file`) and execs it through `/proc/self/fd/INIT_FD`, so the view need not contain the
package (a checkout under the host's /tmp, or under a `deny_read` path, is not in it); the
descriptor is close-on-exec, so neither the init nor the command holds it.
"""

from __future__ import annotations

import functools
import hashlib
import os

from bash_sandbox.linux.native_build import HERE

# Beside the stage's descriptor (`view_steps.STAGE_FD`), below the default 1024 limit.
INIT_FD = 1001
EXEC_PATH = f"/proc/self/fd/{INIT_FD}"
_BUILD = HERE / "_sandbox_init"
_SOURCE = HERE / "native" / "sandbox_init.c"
_MARK = b"bash-sandbox-init-source-sha256:"
# Tests turn it off to exercise the bash PID 1 through the helper (never needed otherwise).
ENABLED = True


@functools.cache
def built() -> str | None:
    """The init's path if this install has a current build that can run from where it is."""
    try:
        data = _BUILD.read_bytes()
        runnable = os.access(_BUILD, os.X_OK) and not os.statvfs(_BUILD).f_flag & os.ST_NOEXEC
    except OSError:
        return None
    # A build from another source (an editable install not rebuilt since) is not used.
    current = not _SOURCE.is_file() or _MARK + _digest(_SOURCE.read_bytes()) in data
    return str(_BUILD) if runnable and current else None


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode()


def for_spawn(wanted: bool) -> str | None:
    """The init a spawn's child should hold (``wanted``: `BackendContext.hold_init`; the
    child opens it first, `ChildSetup.hold_file`), where this install built it."""
    return built() if wanted and ENABLED else None


def pid1_argv(argv: tuple[str, ...], *, compiled: bool) -> tuple[str, ...]:
    """``argv`` (``(bash, "-c", command)``) run as PID 2 under a waiting PID 1: the compiled
    init held at `INIT_FD` when ``compiled`` (it execs an absolute path only), else a bash.

    The command is passed as an argument, never spliced into a script.
    """
    if compiled and argv[0].startswith("/"):
        return (EXEC_PATH, *argv)
    if len(argv) == 3 and argv[1] == "-c":
        # PID 1's own stderr goes to /dev/null so its "Killed" job notice never shows up.
        script = 'exec 3>&2 2>/dev/null; "$0" -c "$1" 2>&3 3>&-; exit'
        return (argv[0], "-c", script, argv[0], argv[2])
    return argv
