"""What a change to a file or directory moves, for the caches that reuse what they read.

A stamp is the identity, size and times of what a path leads to (`os.stat`: through links).
Creating, removing or renaming an entry moves a directory's mtime and ctime; rewriting a file
moves its mtime, ctime and usually its size; putting an old mtime back (`touch -d`, a tool
preserving times) still moves the ctime, which nothing but the kernel sets. The times come
from the kernel's coarse clock, so two changes within one tick look alike (git's "racy
clean"): a cache trusts a stamp only once it is older than `SETTLE_NS`.
"""

from __future__ import annotations

import os
import time

# A stamp newer than this is never trusted: what it stands for is read again.
SETTLE_NS = 2_000_000_000

Stamp = tuple[int, int, int, int, int] | None  # dev, ino, size, mtime_ns, ctime_ns; None: absent


def stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(stamps: tuple[Stamp, ...], settle_ns: int = SETTLE_NS) -> bool:
    """Whether every stamp is old enough to stand for what it stamps (absent ones are)."""
    horizon = time.time_ns() - settle_ns
    return all(s is None or max(s[3], s[4]) < horizon for s in stamps)
