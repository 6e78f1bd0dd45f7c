"""Prepended to every Python attack (run inside the sandbox by the host's python3).

`attempt` prints "ESCAPE <what>" when a forbidden call succeeded, "denied <what>: <error>"
when it was refused, and "UNTRIED <what>" when it cannot be made here (the cell is then
skipped, never contained); only the first is evidence. The attack's own body follows this
text, which is why the imports below look unused here.
"""

import ctypes
import ctypes.util
import errno  # noqa: F401 - used by attack bodies
import fcntl  # noqa: F401 - used by attack bodies
import os
import signal  # noqa: F401 - used by attack bodies
import socket  # noqa: F401 - used by attack bodies
import struct  # noqa: F401 - used by attack bodies
import sys  # noqa: F401 - used by attack bodies
import termios  # noqa: F401 - used by attack bodies
import time  # noqa: F401 - used by attack bodies
from collections.abc import Callable
from typing import TypeVar

print("PY-BEGIN", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ARCH = os.uname().machine
NR: dict[str, int] = {
    "x86_64": dict(
        clone=56,
        ptrace=101,
        rt_sigqueueinfo=129,
        tgkill=234,
        renameat2=316,
        process_vm_readv=310,
        process_vm_writev=311,
        unshare=272,
    ),
    "aarch64": dict(
        clone=220,
        ptrace=117,
        rt_sigqueueinfo=138,
        tgkill=131,
        renameat2=276,
        process_vm_readv=270,
        process_vm_writev=271,
        unshare=97,
    ),
}.get(ARCH, {})
NR.update(pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438)

Result = TypeVar("Result")


class Untried(Exception):
    """The attempt cannot be made here (no syscall number on this architecture)."""


def sys_call(name: str, *args: object) -> int:
    """A raw syscall by name; raises OSError like the os module does."""
    if name not in NR:
        raise Untried(f"no syscall number for {name} on {ARCH}")
    r: int = libc.syscall(NR[name], *args)
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def attempt(name: str, fn: Callable[[], Result]) -> Result | None:
    """Try a forbidden operation; print whether it was denied or escaped."""
    try:
        result = fn()
    except Untried as exc:
        print(f"UNTRIED {name}: {exc}", flush=True)  # never "denied": nothing was tried
        return None
    except OSError as exc:
        print(f"denied {name}: {exc}", flush=True)
        return None
    print(f"ESCAPE {name}: {result!r}"[:300], flush=True)
    return result
