"""When a file was made (statx's birth time): what later changes to it never move.

Python's `os.stat` has no birth time on Linux before 3.12's platforms list it; `statx(2)`
gives it where the filesystem records one (ext4, xfs, btrfs, tmpfs); None elsewhere.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from collections.abc import Callable
from typing import cast

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_BTIME = 0x800
_STATX_SIZE = 256
# struct statx: stx_mask (u32) at 0; stx_btime (struct statx_timestamp: s64 sec, u32 nsec)
# at 0x50.
_BTIME = struct.Struct("=qI")
_BTIME_AT = 0x50


@functools.cache
def _statx() -> Callable[[int, bytes, int, int, ctypes.Array[ctypes.c_char]], int] | None:
    try:
        func = ctypes.CDLL(None, use_errno=True).statx
    except (AttributeError, OSError):
        return None  # not glibc 2.28+ (or not Linux)
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    func.restype = ctypes.c_int
    return cast(Callable[[int, bytes, int, int, ctypes.Array[ctypes.c_char]], int], func)


def birth_ns(path: str) -> int | None:
    """When ``path`` itself (not what a link leads to) was made, in ns since the epoch; None
    where the filesystem or the kernel does not say."""
    statx = _statx()
    if statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buf) != 0:
        return None
    (mask,) = struct.unpack_from("=I", buf, 0)
    if not mask & _STATX_BTIME:
        return None
    seconds, nanos = _BTIME.unpack_from(buf, _BTIME_AT)
    return int(seconds) * 1_000_000_000 + int(nanos)
