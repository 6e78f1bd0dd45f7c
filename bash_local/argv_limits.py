"""What one `execve` can carry, checked before spawning: a command or environment too large
is a request error (`CommandTooLargeError`), never a spawn failure that reads like a broken
host or sandbox.

Linux refuses an exec (E2BIG) when one argument or environment string, NUL included, is
longer than MAX_ARG_STRLEN (32 pages: 131072 bytes), whatever ARG_MAX is, so a single
`bash -c <command>` over 128 KiB fails; and when all strings plus their pointers exceed the
argument space: a quarter of the stack limit (`sysconf(SC_ARG_MAX)`), at most 6 MiB, at
least 128 KiB. A confining wrapper (bwrap) adds its own arguments and variables on top:
`WRAPPER_RESERVE` is kept free for them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from bash_seam import CommandTooLargeError

MAX_ARG_STRLEN = 32 * 4096  # Linux: per string, NUL included; page size 4 KiB
_KERNEL_ARG_CAP = 6 * 1024 * 1024  # 3/4 of _STK_LIM (8 MiB): the kernel's ceiling
_KERNEL_ARG_FLOOR = 128 * 1024  # ARG_MAX: the kernel's floor
# Room for a sandbox wrapper's own argv (mounts, rules) and environment.
WRAPPER_RESERVE = 64 * 1024
_POINTER = 8


def argument_space() -> int:
    """Bytes one exec's strings and pointers may take on this host."""
    try:
        space = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        space = _KERNEL_ARG_FLOOR
    if sys.platform.startswith("linux"):
        space = max(min(space, _KERNEL_ARG_CAP), _KERNEL_ARG_FLOOR)
    return space


def check_exec_size(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Raise `CommandTooLargeError` unless ``argv`` and ``env`` fit one exec with room
    for a wrapper's own arguments."""
    per_string = sys.platform.startswith("linux")
    total = 0
    for index, word in enumerate(argv):
        size = len(os.fsencode(word)) + 1
        total += size + _POINTER
        if per_string and size > MAX_ARG_STRLEN:
            what = "the command" if index == len(argv) - 1 else f"argument {index}"
            raise CommandTooLargeError(
                f"{what} is {size - 1} bytes; Linux passes at most {MAX_ARG_STRLEN - 1} bytes "
                "in one exec argument (MAX_ARG_STRLEN): write the script to a file in the "
                "workspace and run `bash FILE` instead"
            )
    for name, value in env.items():
        value_size = len(os.fsencode(value))
        size = len(os.fsencode(name)) + value_size + 2  # NAME=value\0
        total += size + _POINTER
        if per_string and size > MAX_ARG_STRLEN:
            raise CommandTooLargeError(
                f"the environment variable {name} is {value_size} bytes; Linux "
                f"passes at most {MAX_ARG_STRLEN - 1} bytes in one environment entry "
                "(MAX_ARG_STRLEN): pass a large value in a file instead"
            )
    limit = argument_space() - WRAPPER_RESERVE
    if total > limit:
        raise CommandTooLargeError(
            f"the command and its environment take {total} bytes; one exec on this host "
            f"carries at most {limit} (ARG_MAX {argument_space()}, less {WRAPPER_RESERVE} kept "
            "for the sandbox's own arguments): shorten the environment or pass data in files"
        )
